package db

import (
	"errors"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unreachable says whether err means the database could not be reached or
// dropped the connection (refused, cut, shutting down, out of connection
// slots), rather than refusing a statement: the console answers those
// with 503 "its database is not reachable", not 500 "something went wrong
// on our side" (an outage drill met the latter while PostgreSQL was down).
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300": // admin shutdown, crash shutdown, cannot connect now, too many connections
			return true
		}
		return strings.HasPrefix(pe.Code, "08") // connection exception
	}
	// A network error of an HTTP call (the provider, the identity
	// provider) is not the database's.
	var ue *url.Error
	if errors.As(err, &ue) {
		return false
	}
	var ne *net.OpError
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}
