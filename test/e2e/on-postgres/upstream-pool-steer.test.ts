// upstream-pool-steer.test.ts again, with every control plane it starts on PostgreSQL
// (docs/testing.md#on-postgresql): a drained deployment is stored there and survives the restart.
process.env.TOLLGATE_TEST_STORE = 'postgres';
await import('../upstream-pool-steer.test.js');
