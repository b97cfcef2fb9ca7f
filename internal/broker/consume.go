package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// How an adapter's Subscribe rides out failures to consume (Options.
// MaxConsumeFailures): a pause after each, 500ms doubling to 30s, so the
// default of 10 in a row rides out about two minutes of outage.
const (
	ConsumeRetryBase          = 500 * time.Millisecond
	ConsumeRetryCap           = 30 * time.Second
	DefaultMaxConsumeFailures = 10
)

// ErrSessionEnded is a consume session that the broker or the connection
// ended rather than the caller.
var ErrSessionEnded = errors.New("the consume session ended")

// ConsumeSession runs one consume session until ctx ends (nil), the broker
// ends it, or a step fails. consumed reports that it got as far as
// consuming, so its end is not a failure to start.
type ConsumeSession func(ctx context.Context) (consumed bool, err error)

// RetryConsume runs session again and again until ctx ends (then it returns
// nil). Each session that ends, or fails to start, is logged on log and
// followed by a pause; a session that got as far as consuming resets both
// the pause and the count. After maxFailures failures in a row (0: the
// default; negative: never) it returns the last one, so the consumer stops
// visibly (the console's consume subcommand exits non-zero) instead of
// retrying in silence. adapter names the broker in the log ("RabbitMQ"),
// and kind and name the subscription ("queue", "sluice.reference").
func RetryConsume(ctx context.Context, log *slog.Logger, maxFailures int, adapter, kind, name string, session ConsumeSession) error {
	if maxFailures == 0 {
		maxFailures = DefaultMaxConsumeFailures
	}
	if log == nil {
		log = slog.Default()
	}
	wait := ConsumeRetryBase
	failures := 0
	for {
		consumed, err := session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = ErrSessionEnded
		}
		if consumed {
			failures, wait = 0, ConsumeRetryBase
		}
		failures++
		if maxFailures > 0 && failures >= maxFailures {
			log.Error("broker: "+adapter+" consume failed, giving up", kind, name, "failures", failures, "err", err)
			return fmt.Errorf("broker: consume %s failed %d times in a row: %w", name, failures, err)
		}
		log.Warn("broker: "+adapter+" consume failed, retrying", kind, name, "failures", failures, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, ConsumeRetryCap)
	}
}
