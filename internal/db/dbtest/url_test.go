package dbtest

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A URL written back for a subcommand must connect as the parsed config
// would: same user, password, host, port and database.
func TestURLOfKeepsEveryConnectionSetting(t *testing.T) {
	for _, in := range []string{
		"postgres://app:s%40cret%2Fx@db.example:6543/postgres?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"host=/var/run/postgresql port=5433 user=u password=p dbname=postgres sslmode=disable",
	} {
		cfg, err := pgxpool.ParseConfig(in)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Database = "sluice_test_x"
		got, err := pgx.ParseConfig(urlOf(cfg))
		if err != nil {
			t.Fatalf("%s: written back as %q, which does not parse: %v", in, urlOf(cfg), err)
		}
		want := cfg.ConnConfig
		if got.User != want.User || got.Password != want.Password || got.Host != want.Host || got.Port != want.Port || got.Database != "sluice_test_x" {
			t.Errorf("%s: written back as %q: user %q password set %v host %q port %d db %q; want user %q password set %v host %q port %d",
				in, urlOf(cfg), got.User, got.Password == want.Password, got.Host, got.Port, got.Database, want.User, want.Password != "", want.Host, want.Port)
		}
	}
}
