// The set the node keeps of things that live for one request (open responses, bodies being read,
// what keys have open): an array in which each member knows its slot, so adding and removing are
// O(1), allocate nothing, and leave no pointer to a member once it is out
// (docs/design.md#sets-of-requests-in-flight).
//
// Why not `Set`: a long-lived `Set` with a member added and removed per request rehashes its table
// every few hundred requests, and V8 keeps each replaced table, with its pointers to the members it
// held, until the next full collection (for iterators still on it). Those dead tables sit in the old
// generation, so every request still in flight at a rehash, and everything it reaches, survives the
// young collections and is promoted. Measured on the JSON chat path: 1.4 MB survived each young
// collection with three such sets, 0.4 MB without, and the node's CPU per request rose by half.

/** A member of one SlotSet: its slot there, -1 while in none (start it at -1). */
export interface Slotted {
  slot: number;
}

export class SlotSet<T extends Slotted> {
  private readonly items: T[] = [];

  get size(): number {
    return this.items.length;
  }

  /** Adds `x` (already in: nothing). */
  add(x: T): void {
    if (this.has(x)) return;
    x.slot = this.items.length;
    this.items.push(x);
  }

  has(x: T): boolean {
    const i = x.slot;
    return i >= 0 && i < this.items.length && this.items[i] === x;
  }

  /** Removes `x`; false when it was not in. The last member takes its slot. */
  delete(x: T): boolean {
    if (!this.has(x)) return false;
    const last = this.items.pop()!;
    if (last !== x) {
      this.items[x.slot] = last;
      last.slot = x.slot;
    }
    x.slot = -1;
    return true;
  }

  /** A copy of the members (safe to remove members while walking it). */
  values(): T[] {
    return this.items.slice();
  }
}
