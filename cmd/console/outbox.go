package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/internal/audit"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/db"
	"github.com/sluice-dev/sluice/internal/outbox"
)

const outboxUsage = `Usage: console outbox <pause|resume> TOPIC --reason R [--actor A]
       console outbox recount

  pause TOPIC --reason R    stop publishing TOPIC: relays skip its events at their next claim
                            (a batch already claimed is still published); new events wait as pending
  resume TOPIC --reason R   publish TOPIC again: its backlog goes out in order per aggregate
  recount                   count the pending and dead events per topic again and replace the
                            backlog counts with the result (repair: after outbox_event.status was
                            changed by hand, or rows were written with the counting triggers disabled)

The pause is kept in the database (it survives relay and console restarts) and
shows on the console's dashboard and outbox list. Each attempt writes the same
audit row as the console's buttons, with the CLI user as actor. Pausing a paused
topic, or resuming a running one, changes nothing and exits 1.

The backlog counts (the dashboard's backlog and dead letters, /metrics'
sluice_outbox_backlog and sluice_outbox_dead_letter) are kept on every write;
recount reads O(pending + dead) rows and is safe while relays and producers run.
`

func runOutbox(ctx context.Context, e env, args []string) error {
	verb, args, found := verbAmongFlags(args, &config.OutboxTopic{})
	switch {
	case !found && askedForHelp(args), verb == "help":
		fmt.Fprint(e.stdout, outboxUsage)
		return config.ErrHelp
	case !found:
		fmt.Fprint(e.stderr, outboxUsage)
		return &config.UsageError{Err: errors.New("want a verb: pause, resume or recount")}
	}
	switch verb {
	case "pause", "resume":
	case "recount":
		return runOutboxRecount(ctx, e, args)
	default:
		return &config.UsageError{Err: fmt.Errorf("unknown verb %q (want pause, resume or recount)", verb)}
	}
	var c config.OutboxTopic
	pos, err := configure(e, "outbox "+verb, verbSummary(outboxUsage), &c, args, func(pos []string) error {
		if len(pos) != 1 {
			return fmt.Errorf("outbox %s wants exactly one argument, the TOPIC (got %d)", verb, len(pos))
		}
		if strings.TrimSpace(c.Reason) == "" { // a usage error (2), as the TOPIC's absence is
			return errors.New("--reason is required: say why (it is kept in the audit trail)")
		}
		return outbox.ValidTopic(pos[0])
	})
	if err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	actor := c.Actor
	if actor == "" {
		actor = osActor()
	}
	// The same actor shape as `payments reconcile`: the CLI as issuer.
	base := audit.Event{ActorIss: "cli", ActorSub: actor, ActorName: actor, ActorRoles: []string{"cli"}}
	topic := pos[0]
	p, err := outbox.SetTopicPaused(ctx, pool, topic, verb == "pause", c.Reason, base)
	var conflict *outbox.TopicConflictError
	switch {
	case errors.As(err, &conflict) && conflict.Paused != nil:
		return fmt.Errorf("topic %s is already paused by %s since %s: %s; nothing changed", topic, conflict.Paused.PausedBy,
			conflict.Paused.PausedAt.UTC().Format("2006-01-02 15:04:05 UTC"), conflict.Paused.Reason)
	case errors.As(err, &conflict):
		return fmt.Errorf("topic %s is not paused; nothing changed", topic)
	case err != nil:
		return err
	}
	if verb == "pause" {
		fmt.Fprintf(e.stdout, "topic %s paused by %s: relays skip it from their next claim\n", topic, p.PausedBy)
	} else {
		fmt.Fprintf(e.stdout, "topic %s resumed (it was paused by %s since %s)\n", topic, p.PausedBy, p.PausedAt.UTC().Format("2006-01-02 15:04:05 UTC"))
	}
	return nil
}

// runOutboxRecount replaces the backlog counts with an exact recount.
func runOutboxRecount(ctx context.Context, e env, args []string) error {
	var c config.Database
	if _, err := configure(e, "outbox recount", verbSummary(outboxUsage), &c, args, func(pos []string) error {
		if len(pos) > 0 {
			return fmt.Errorf("outbox recount takes no arguments (got %v)", pos)
		}
		return nil
	}); err != nil {
		return err
	}
	pool, err := db.OpenCurrent(ctx, c.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	pending, dead, err := outbox.RecountBacklog(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "backlog recounted: %d pending, %d dead\n", pending, dead)
	return nil
}
