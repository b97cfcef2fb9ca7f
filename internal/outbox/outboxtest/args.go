package outboxtest

import "github.com/jackc/pgx/v5"

func pgxArgs(s Seed) pgx.NamedArgs {
	return pgx.NamedArgs{"n": s.N, "topic": s.Topic, "agg_type": s.AggregateType, "agg_id": s.AggregateID,
		"type": s.EventType, "status": s.Status, "age": s.Age, "attempts": s.Attempts, "last_error": s.LastError, "in_flight": s.InFlight}
}
