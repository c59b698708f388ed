// A node whose key table grows toward its heap limit (see heap-flags.ts) says so before V8 gives up:
// checked after each snapshot or delta is applied, one warning per crossing of 70%, re-armed below 60%.
import { getHeapStatistics } from 'node:v8';

export interface HeapStats {
  used_heap_size: number;
  heap_size_limit: number;
}

export function heapWatch(warn: (line: string) => void, stats: () => HeapStats = getHeapStatistics): () => void {
  let warned = false;
  return () => {
    const h = stats();
    const share = h.used_heap_size / h.heap_size_limit;
    if (!warned && share > 0.7) {
      warned = true;
      const mb = (n: number) => Math.round(n / 1048576);
      warn(`heap ${mb(h.used_heap_size)} MB used of its ${mb(h.heap_size_limit)} MB limit: start the node with a larger --max-old-space-size (docs/deployment.md#memory)`);
    } else if (warned && share < 0.6) {
      warned = false;
    }
  };
}
