package config

import "strings"

// OutboxTopic configures `console outbox pause|resume TOPIC --reason R`.
type OutboxTopic struct {
	DatabaseURL string
	Reason      string // per invocation: no environment twin, so a variable left set never repeats an action
	Actor       string // who acts, for the audit row (empty: the OS user and host)
}

// Register adds the flags.
func (c *OutboxTopic) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
	f.String(&c.Reason, "reason", "", "", "why (required; kept in the audit trail)")
	f.String(&c.Actor, "actor", "OUTBOX_ACTOR", "", "who acts, named in the audit row (default: OS user@host)")
}

// Validate checks the settings.
func (c *OutboxTopic) Validate() error {
	var ck Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	if strings.TrimSpace(c.Reason) == "" {
		ck.Failf("--reason is required: say why (it is kept in the audit trail)")
	}
	return ck.Err()
}
