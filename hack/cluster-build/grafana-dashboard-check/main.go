// grafana-dashboard-check: checks Grafana dashboard JSON files against Grafana's own dashboard
// schema, as grafana-foundation-sdk (generated from Grafana's schemas) decodes it strictly:
// unknown or missing required fields, wrong types, panel options of each panel plugin (timeseries,
// stat, ...) and Prometheus queries are errors; then the schema's validation constraints.
//
//	grafana-dashboard-check FILE...
//
// Prints one line per problem and exits 1 when there is any (2 on usage errors).
package main

import (
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: grafana-dashboard-check FILE...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	failed := false
	for _, path := range os.Args[1:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		var d dashboard.Dashboard
		if err := problems(d.UnmarshalJSONStrict(raw)); err != nil {
			fmt.Printf("%s: does not match the dashboard schema: %v\n", path, err)
			failed = true
			continue
		}
		if err := problems(d.Validate()); err != nil {
			fmt.Printf("%s: %v\n", path, err)
			failed = true
			continue
		}
		title := ""
		if d.Title != nil {
			title = *d.Title
		}
		fmt.Printf("%s: ok (%q, %d panels)\n", path, title, len(d.Panels))
	}
	if failed {
		os.Exit(1)
	}
}

// problems is err unless it is an empty cog.BuildErrors: the SDK returns its error list as an
// error even when the list is empty.
func problems(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}
