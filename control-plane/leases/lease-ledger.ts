// Leases: the control plane's account of what each node connection may admit. Pure: no I/O, no
// timers; the lease service (lease-service.ts) sends the reclaims it asks for and calls it again
// when they are answered.
//
// One ledger per kind of lease, each in its own file: keys' rpm and tpm per minute
// (key-lease-ledger.ts), parallel-request slots (slot-ledger.ts), and organisations' money
// (money-lease-ledger.ts); small shared helpers in lease-math.ts.
