package main

import "testing"

// D1's list-page goals compare the buffers each page's statements read, taken
// from the top node of their plans: a child's buffers or the planner's would
// hide a plan that reads more as the page goes deeper.
func TestRootBuffersReadsTheTopNodeOnly(t *testing.T) {
	plan := `Limit  (cost=0.42..231.88 rows=51 width=123) (actual time=0.016..0.111 rows=51 loops=1)
  Buffers: shared hit=162 read=7 dirtied=1
  ->  Index Scan Backward using outbox_event_pkey on outbox_event e  (actual time=0.016..0.108 rows=51 loops=1)
        Buffers: shared hit=155 read=7
        SubPlan 1
          ->  Index Only Scan using outbox_event_pending_aggregate_idx on outbox_event h  (actual rows=0 loops=51)
                Buffers: shared hit=153
Planning:
  Buffers: shared hit=4
Planning Time: 0.163 ms
Execution Time: 0.127 ms`
	if got := rootBuffers(plan); got != 169 {
		t.Fatalf("rootBuffers = %d, want 169 (hit 162 + read 7 of the top node)", got)
	}
	noBuffers := `Result  (cost=0.00..0.01 rows=1 width=8) (actual time=0.000..0.000 rows=1 loops=1)
Planning:
  Buffers: shared hit=3
Planning Time: 0.007 ms`
	if got := rootBuffers(noBuffers); got != 0 {
		t.Fatalf("rootBuffers = %d for a statement that read nothing, want 0 (the planner's buffers are not the statement's)", got)
	}
}
