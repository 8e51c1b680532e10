// Command cdivalidate judges CDI spec files with the CDI reference library (tags.cncf.io/container-
// device-interface), as a container runtime that links it (containerd, CRI-O, podman) would:
//
//	cdivalidate SPEC_DIR [QUALIFIED_DEVICE ...]
//
// Every *.json/*.yaml file in SPEC_DIR is parsed strictly (unknown fields are errors) and validated
// (cdiVersion against the features the spec uses, vendor/class, annotations, names, edits). Then each
// named device - every device of the directory when none is named - is injected, on its own, into an
// empty OCI runtime spec, which is where a device node the runtime cannot create is refused (no
// type/major/minor and no host node to read them from).
//
// Output (stdout, one JSON document): {"devices": {"<qualified name>": <OCI spec after injection>}}.
// Exit status: 0 valid; 1 a spec or an injection failed (errors on stderr); 2 usage.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdivalidate SPEC_DIR [QUALIFIED_DEVICE ...]")
		os.Exit(2)
	}
	dir := os.Args[1]
	failed := false

	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot list %s: %v\n", dir, err)
		os.Exit(1)
	}
	sort.Strings(files)
	for _, f := range files {
		if ext := filepath.Ext(f); ext != ".json" && ext != ".yaml" {
			continue
		}
		if _, err := cdi.ReadSpec(f, 0); err != nil {
			fmt.Fprintf(os.Stderr, "INVALID %s: %v\n", f, err)
			failed = true
		}
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot load %s: %v\n", dir, err)
		failed = true
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "CACHE %s: %v\n", path, e)
			failed = true
		}
	}

	devices := os.Args[2:]
	if len(devices) == 0 {
		devices = cache.ListDevices()
	}
	if len(devices) == 0 {
		fmt.Fprintf(os.Stderr, "no CDI devices found in %s\n", dir)
		failed = true
	}
	out := map[string]*oci.Spec{}
	for _, name := range devices {
		spec := &oci.Spec{Version: oci.Version, Process: &oci.Process{}, Linux: &oci.Linux{}}
		unresolved, err := cache.InjectDevices(spec, name)
		if err != nil {
			fmt.Fprintf(os.Stderr, "INJECT %s: %v (unresolved %v)\n", name, err, unresolved)
			failed = true
			continue
		}
		out[name] = spec
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"devices": out}); err != nil {
		fmt.Fprintf(os.Stderr, "cannot write the result: %v\n", err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}
