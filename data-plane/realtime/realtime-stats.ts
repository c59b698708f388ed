// The realtime figures the admin listener's GET /stats/realtime shows.
import type { RealtimeMemory } from './realtime-memory.js';

export class RealtimeStats {
  open = 0;
  opened = 0;
  pausedUpstreams = 0;
  /** The most uWS held for one client at any time since start (or the last reset). */
  peakBufferedBytes = 0;
  /** The node-wide bound, for its figures. */
  memory: RealtimeMemory | null = null;

  snapshot(reset = false): { open: number; opened: number; paused_upstreams: number; peak_buffered_bytes: number; node_buffered_bytes: number; node_peak_buffered_bytes: number; node_max_buffered_bytes: number } {
    const out = {
      open: this.open,
      opened: this.opened,
      paused_upstreams: this.pausedUpstreams,
      peak_buffered_bytes: this.peakBufferedBytes,
      node_buffered_bytes: this.memory?.held ?? 0,
      node_peak_buffered_bytes: this.memory?.peak ?? 0,
      node_max_buffered_bytes: this.memory?.maxBytes ?? 0,
    };
    if (reset) {
      this.peakBufferedBytes = 0;
      if (this.memory) this.memory.peak = this.memory.held;
    }
    return out;
  }
}
