// Package brokerurl opens the broker a BROKER_URL names, picking the adapter
// by the URL's scheme. It links every adapter, so only the programs that
// connect to a broker (cmd/console, the demo) import it; the contract in
// package broker stays free of them.
package brokerurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/sluice-dev/sluice/internal/broker"
	"github.com/sluice-dev/sluice/internal/broker/natsbroker"
	"github.com/sluice-dev/sluice/internal/broker/rabbitbroker"
)

// ErrUnsupportedScheme reports a BROKER_URL that is neither NATS nor AMQP.
var ErrUnsupportedScheme = errors.New("broker: unsupported URL scheme (use nats:// or amqp://)")

// Open connects to the broker named by rawURL: nats:// or tls:// (NATS
// JetStream) or amqp:// or amqps:// (RabbitMQ).
func Open(ctx context.Context, rawURL string, opts broker.Options) (broker.Broker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker: BROKER_URL is not a URL: %w", err)
	}
	// Each case returns its own nil on error: a nil *JetStream in a
	// broker.Broker would not compare equal to nil.
	switch u.Scheme {
	case "nats", "tls":
		b, err := natsbroker.Open(ctx, rawURL, opts)
		if err != nil {
			return nil, err
		}
		return b, nil
	case "amqp", "amqps":
		b, err := rabbitbroker.Open(ctx, rawURL, opts)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrUnsupportedScheme, u.Scheme)
}
