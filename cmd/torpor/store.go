package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/store/postgres"
)

// storeCmd is `torpor store`: work on a daemon's store directly, with
// the daemon stopped.
func (c *cli) storeCmd() *cobra.Command {
	st := &cobra.Command{Use: "store", Short: "Work on a store directly (the daemon stopped): copy SQLite into PostgreSQL"}
	var from, to, keyDir string
	cp := &cobra.Command{
		Use:   "copy --from FILE.db --to postgres://USER@HOST/DB",
		Short: "Copy a SQLite store (sandboxes, events, ledger, keys, templates, webhooks, secrets) into an empty PostgreSQL database",
		Long: `Copy everything a torpor daemon keeps in its SQLite file into a new, empty
PostgreSQL database, in one transaction: sandboxes and their events, the
usage ledger, tenants and keys, templates, webhooks and their cursors,
tenants' secrets, GPU leases and warm pools. Event and ledger numbers move
as they are, so cursors keep their meaning. A target that holds anything
is refused.

Stop the daemon first. Webhook and tenant secrets are sealed again with
the webhook.key in --key-dir (default: the directory of --from, the data dir):
start the daemons that use the database with that data dir's key.
See docs/postgres.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				to = c.getenv("TORPOR_STORE")
			}
			switch {
			case from == "":
				return errors.New("--from FILE.db is required (the SQLite file, e.g. /var/lib/torpor/torpor.db)")
			case !postgres.IsURL(to):
				return fmt.Errorf("--to must be a postgres:// URL, got %q", postgres.Redact(to))
			}
			if _, err := os.Stat(from); err != nil {
				return err
			}
			if keyDir == "" {
				keyDir = filepath.Dir(from)
			}
			dst, err := postgres.Open(cmd.Context(), postgres.Options{URL: to, KeyDir: keyDir})
			if err != nil {
				return err
			}
			defer dst.Close()
			var rows int64
			err = postgres.CopyFromSQLite(cmd.Context(), from, dst, func(table string, done, total int64) {
				fmt.Fprintf(c.stderr, "copying %-16s %d/%d rows\n", table, done, total)
				if done == total {
					rows += total
				}
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "copied %d rows from %s to %s\n", rows, from, dst.Where())
			return nil
		},
	}
	cp.Flags().StringVar(&from, "from", "", "the SQLite store to copy (DATA_DIR/torpor.db)")
	cp.Flags().StringVar(&to, "to", "", "the PostgreSQL database to copy into, empty (default: $TORPOR_STORE)")
	cp.Flags().StringVar(&keyDir, "key-dir", "", "directory of the webhook.key the copied secrets are sealed with (default: the directory of --from)")
	st.AddCommand(cp)
	return st
}
