#!/usr/bin/env node
// The package's `tollgate` bin: registers tsx in this process and runs cli/main.ts, which reads
// process.argv and sets process.exitCode itself (stdio and exit code are this process's own).
import { register } from 'tsx/esm/api';

register();
await import(new URL('./main.ts', import.meta.url).href);
