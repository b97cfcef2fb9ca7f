package main

import "errors"

// errNotBuilt backs the todo_*.go placeholders; it goes with the last of them.
var errNotBuilt = errors.New("not built yet")
