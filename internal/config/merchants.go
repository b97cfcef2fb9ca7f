package config

// Merchants configures `console merchants …`: the payments API's merchants,
// their accounts and their API keys.
type Merchants struct {
	Verb        string // add, assign, keys or revoke: set before Register
	DatabaseURL string
	Name        string
	Accounts    string // comma-separated account ids
	NewKey      bool
}

// Register adds the flags of c.Verb: name (add), accounts (add, assign)
// and new (keys) only where they mean something.
func (c *Merchants) Register(f *Flags) {
	registerDatabaseURL(f, &c.DatabaseURL, "PostgreSQL ≥ 15 connection URL")
	switch c.Verb {
	case "add":
		f.String(&c.Name, "name", "", "", "display name of the merchant")
		f.String(&c.Accounts, "account", "", "", "comma-separated ids of existing accounts to give the merchant (accounts owned by another merchant are refused)")
	case "assign":
		f.String(&c.Accounts, "account", "", "", "comma-separated ids of existing accounts to give the merchant (accounts owned by another merchant are refused)")
	case "keys":
		f.Bool(&c.NewKey, "new", "", false, "create a new API key and print it once (it is stored hashed and cannot be shown again)")
	}
}

// Validate checks the settings.
func (c *Merchants) Validate() error {
	var ck Check
	ck.DatabaseURL("DATABASE_URL", c.DatabaseURL)
	return ck.Err()
}
