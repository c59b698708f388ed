// webhooks.test.ts again, with every control plane it starts on PostgreSQL (docs/testing.md#on-postgresql):
// set before the file is loaded, so its helpers read it.
process.env.TOLLGATE_TEST_STORE = 'postgres';
await import('../webhooks.test.js');
