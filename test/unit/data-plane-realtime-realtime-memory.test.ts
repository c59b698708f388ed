// The node-wide bound on what realtime sessions hold (realtime-memory.ts): a table of figures.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RealtimeMemory, type MemoryMember } from '../../data-plane/realtime/realtime-memory.js';
import { RealtimeStats } from '../../data-plane/realtime/realtime-stats.js';

class Member implements MemoryMember {
  woken = 0;
  remeasured = 0;
  held = 0;
  constructor(private readonly memory: RealtimeMemory) {}
  set(bytes: number): number {
    const total = this.memory.update(this.held, bytes);
    this.held = bytes;
    return total;
  }
  remeasure(): void {
    this.remeasured++;
  }
  roomAgain(): void {
    this.woken++;
  }
}

test('the total follows each session, is full at the bound, and wakes waiting sessions under three quarters', () => {
  const memory = new RealtimeMemory(1000);
  const [a, b] = [new Member(memory), new Member(memory)];
  memory.join(a);
  memory.join(b);
  assert.equal(a.set(600), 600);
  assert.equal(memory.full, false);
  assert.equal(b.set(400), 1000);
  assert.equal(memory.full, true);
  memory.waitForRoom(b);
  // Still at or above three quarters: nobody woken.
  a.set(400);
  memory.relieve();
  assert.equal(b.woken, 0);
  a.set(300);
  memory.relieve();
  assert.equal(b.woken, 1, 'under 750: woken once');
  memory.relieve();
  assert.equal(b.woken, 1, 'and only once');
  // A session that leaves takes its bytes with it and relieves the others.
  memory.waitForRoom(b);
  b.set(800);
  assert.equal(memory.held, 1100);
  memory.leave(a, a.held);
  assert.equal(memory.held, 800);
  assert.equal(b.woken, 1);
  b.set(100);
  memory.remeasureAll();
  assert.deepEqual([a.remeasured, b.remeasured, b.woken], [0, 1, 2]);
  memory.leave(b, b.held);
  assert.equal(memory.held, 0);
});

test('the peak is the most held together, kept when bytes leave, and a reset starts it from what is held now', () => {
  const memory = new RealtimeMemory(1000);
  const stats = new RealtimeStats();
  stats.memory = memory;
  const a = new Member(memory);
  const b = new Member(memory);
  a.set(600);
  b.set(500);
  a.set(200);
  assert.deepEqual([memory.held, memory.peak], [700, 1100]);
  const s = stats.snapshot(true);
  assert.deepEqual([s.node_buffered_bytes, s.node_peak_buffered_bytes], [700, 1100]);
  assert.equal(stats.snapshot().node_peak_buffered_bytes, 700);
  b.set(0);
  assert.equal(stats.snapshot().node_peak_buffered_bytes, 700);
});
