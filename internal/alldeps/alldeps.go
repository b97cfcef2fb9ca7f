// Package alldeps pins the dependency set while the rooms are being built.
// TEMPORARY: removed once every dependency has a real importer.
package alldeps

import (
	_ "github.com/PuerkitoBio/goquery"
	_ "github.com/a-h/templ"
	_ "github.com/chromedp/chromedp"
	_ "github.com/coreos/go-oidc/v3/oidc"
	_ "github.com/coreos/go-oidc/v3/oidc/oidctest"
	_ "github.com/google/uuid"
	_ "github.com/gorilla/websocket"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/labstack/echo/v4"
	_ "github.com/labstack/echo/v4/middleware"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/rabbitmq/amqp091-go"
	_ "github.com/shopspring/decimal"
	_ "github.com/zitadel/oidc/v3/pkg/oidc"
	_ "github.com/zitadel/oidc/v3/pkg/op"
	_ "golang.org/x/oauth2"
)
