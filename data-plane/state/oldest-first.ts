// A queue of records, oldest first, that a record may leave from anywhere: one that left is marked
// gone and stepped over when it reaches the front. Why not a Set's first entry: after many deletions
// at a Set's front, V8 walks over every deleted entry to find the first live one (~100 µs per
// record at 100,000). Compacted once the entries gone outnumber the live ones, so each record costs
// O(1) amortized. Pure.

export interface Queued {
  /** Set by the owner of the record when it leaves (then `left` is called once). */
  gone: boolean;
}

export class OldestFirst<T extends Queued> {
  private items: T[] = [];
  private head = 0;
  /** Records in it not gone. */
  size = 0;

  push(item: T): void {
    this.items.push(item);
    this.size++;
  }

  /** The oldest record not gone, or undefined. */
  oldest(): T | undefined {
    while (this.head < this.items.length && this.items[this.head].gone) this.head++;
    return this.items[this.head];
  }

  /** One of its records was marked gone. */
  left(): void {
    this.size--;
    if (this.items.length > 2 * this.size + 64) {
      this.items = this.items.filter((x, i) => i >= this.head && !x.gone);
      this.head = 0;
    }
  }
}
