// Package static embeds the console's CSS, scripts and vendored htmx
// (versions pinned in VERSIONS).
package static

import "embed"

// FS holds the files served under /static/.
//
//go:embed *.css *.js *.svg VERSIONS
var FS embed.FS
