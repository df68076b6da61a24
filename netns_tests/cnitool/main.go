// cnitool: a small CNI runtime front end for the rdmanet netns tests.
//
// It behaves like the upstream `cnitool` (containernetworking/cni, v1.x) and
// is built on libcni as shipped by Debian (golang-github-appc-cni-dev 1.1.2):
//
//	cnitool add|check|del|gc|status <net> <netns>
//
// Environment (same names and meaning as upstream cnitool):
//
//	NETCONFPATH  directory holding the network configs (default /etc/cni/net.d).
//	             libcni.LoadConfList looks at *.conflist first, then at
//	             *.conf / *.json, and wraps a single conf into a one-plugin list.
//	CNI_PATH     ':'-separated list of directories searched for plugins.
//	CNI_ARGS     "K=V;K=V" passed to plugins; every pair must contain exactly
//	             one '=' with a non-empty key and value, otherwise we fail.
//	CAP_ARGS     JSON object used as the runtime's capability arguments.
//	CNI_IFNAME   interface name inside the container (default eth0).
//
// Extensions over upstream, for the tests:
//
//	CNI_CACHE_DIR          overrides libcni's cache dir (default /var/lib/cni);
//	                       results are cached under <dir>/results/<net>-<cid>-<ifname>.
//	CNI_VALID_ATTACHMENTS  JSON list of {"containerID":..,"ifname":..} objects,
//	                       sent to plugins on GC as "cni.dev/valid-attachments";
//	                       the key is omitted when the variable is unset/empty.
//	Error JSON on stdout   when a command fails with a *types.Error (what plugins
//	                       return, and what libcni's own validators return), the
//	                       error is also printed on stdout as
//	                       {"code":N,"msg":"...","details":"..."} so callers can
//	                       read the CNI error code. The human-readable error goes
//	                       to stderr and the exit status is 1, as upstream.
//
// The container ID is derived from the netns path exactly like upstream:
// "cnitool-" + hex(sha512(absolute netns path)[:10]).
//
// libcni 1.1.2 predates the GC and STATUS verbs (CNI spec 1.1.0), so `gc` and
// `status` execute every plugin of the list directly, in list order, with the
// stdin that newer libcni builds (the plugin's config with the list's "name"
// and "cniVersion" injected, plus "cni.dev/valid-attachments" for GC). Like
// newer libcni, both verbs are a successful no-op for lists whose cniVersion
// is below 1.1.0, GC runs every plugin and reports all failures, and STATUS
// stops at the first failing plugin. Unlike newer libcni, `gc` does not first
// DEL stale cached attachments: libcni 1.1.2 cannot enumerate its cache.
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// Environment variable names.
const (
	envNetDir           = "NETCONFPATH"
	envCNIPath          = "CNI_PATH"
	envCNIArgs          = "CNI_ARGS"
	envCapabilityArgs   = "CAP_ARGS"
	envIfName           = "CNI_IFNAME"
	envCacheDir         = "CNI_CACHE_DIR"
	envValidAttachments = "CNI_VALID_ATTACHMENTS"

	defaultNetDir = "/etc/cni/net.d"
	defaultIfName = "eth0"

	// First CNI spec version that defines GC and STATUS.
	gcStatusMinVersion = "1.1.0"
)

// gcAttachment mirrors one entry of "cni.dev/valid-attachments" (CNI spec 1.1).
type gcAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func usage() {
	exe := filepath.Base(os.Args[0])
	fmt.Fprintf(os.Stderr, "%s: Add, check, remove, garbage-collect or query the status of network interfaces using CNI plugins.\n", exe)
	fmt.Fprintf(os.Stderr, "Usage: %s add|check|del|gc|status <net> <netns>\n", exe)
	os.Exit(1)
}

// exit terminates the process: status 0 when err is nil, otherwise the error
// goes to stderr (and, for CNI errors, as JSON to stdout) with status 1.
func exit(err error) {
	if err == nil {
		os.Exit(0)
	}
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		// Extension: machine-readable copy of the CNI error on stdout.
		// "details" is always present so callers need not special-case it.
		out, merr := json.Marshal(map[string]interface{}{
			"code":    cniErr.Code,
			"msg":     cniErr.Msg,
			"details": cniErr.Details,
		})
		if merr == nil {
			fmt.Fprintln(os.Stdout, string(out))
		}
	}
	fmt.Fprintf(os.Stderr, "%s\n", err)
	os.Exit(1)
}

// parseCNIArgs turns "K=V;K=V" into key/value pairs, rejecting any pair that
// is not exactly one non-empty key and one non-empty value (as upstream).
func parseCNIArgs(s string) ([][2]string, error) {
	var pairs [][2]string
	for _, item := range strings.Split(s, ";") {
		kv := strings.Split(item, "=")
		if len(kv) != 2 || kv[0] == "" || kv[1] == "" {
			return nil, fmt.Errorf("invalid CNI_ARGS pair %q", item)
		}
		pairs = append(pairs, [2]string{kv[0], kv[1]})
	}
	return pairs, nil
}

// containerIDFor derives the container ID from the absolute netns path.
func containerIDFor(netnsPath string) string {
	sum := sha512.Sum512([]byte(netnsPath))
	return fmt.Sprintf("cnitool-%x", sum[:10])
}

// multiError holds several errors (Go 1.19 has no errors.Join). errors.As
// finds the first matching one, so a plugin's *types.Error stays reachable.
type multiError []error

func (m multiError) Error() string {
	msgs := make([]string, len(m))
	for i, e := range m {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

func (m multiError) As(target interface{}) bool {
	for _, e := range m {
		if errors.As(e, target) {
			return true
		}
	}
	return false
}

// joinErrors returns nil, the only error, or a multiError.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	default:
		return multiError(errs)
	}
}

// execRaw runs one plugin of the list with a verb libcni 1.1.2 does not know
// (GC or STATUS). Only CNI_COMMAND and CNI_PATH carry values; the other CNI_*
// variables are set empty, as newer libcni does for these verbs.
func execRaw(ctx context.Context, verb string, plugin *libcni.NetworkConfig, inject map[string]interface{}, paths []string) error {
	conf, err := libcni.InjectConf(plugin, inject)
	if err != nil {
		return fmt.Errorf("failed to generate configuration for %s of plugin %s: %w", verb, plugin.Network.Type, err)
	}
	pluginPath, err := invoke.FindInPath(plugin.Network.Type, paths)
	if err != nil {
		return err
	}
	args := &invoke.Args{
		Command: verb,
		Path:    strings.Join(paths, string(os.PathListSeparator)),
	}
	return invoke.ExecPluginWithoutResult(ctx, pluginPath, conf.Bytes, args, nil)
}

// gcList issues GC to every plugin of the list, collecting all failures.
func gcList(ctx context.Context, list *libcni.NetworkConfigList, paths []string, valid []gcAttachment) error {
	if ok, _ := version.GreaterThanOrEqualTo(list.CNIVersion, gcStatusMinVersion); !ok {
		return nil
	}
	inject := map[string]interface{}{
		"name":       list.Name,
		"cniVersion": list.CNIVersion,
	}
	if valid != nil {
		inject["cni.dev/valid-attachments"] = valid
	}
	var errs []error
	for _, plugin := range list.Plugins {
		if err := execRaw(ctx, "GC", plugin, inject, paths); err != nil {
			errs = append(errs, fmt.Errorf("failed to GC plugin %s: %w", plugin.Network.Type, err))
		}
	}
	return joinErrors(errs)
}

// statusList issues STATUS to every plugin of the list, stopping at the first
// failure so the caller sees that plugin's error code unchanged.
func statusList(ctx context.Context, list *libcni.NetworkConfigList, paths []string) error {
	if ok, _ := version.GreaterThanOrEqualTo(list.CNIVersion, gcStatusMinVersion); !ok {
		return nil
	}
	inject := map[string]interface{}{
		"name":       list.Name,
		"cniVersion": list.CNIVersion,
	}
	for _, plugin := range list.Plugins {
		if err := execRaw(ctx, "STATUS", plugin, inject, paths); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if len(os.Args) < 4 {
		usage()
	}
	verb, netName, netnsArg := os.Args[1], os.Args[2], os.Args[3]
	switch verb {
	case "add", "check", "del", "gc", "status":
	default:
		usage()
	}

	netdir := os.Getenv(envNetDir)
	if netdir == "" {
		netdir = defaultNetDir
	}
	netconf, err := libcni.LoadConfList(netdir, netName)
	if err != nil {
		exit(err)
	}

	var capabilityArgs map[string]interface{}
	if v := os.Getenv(envCapabilityArgs); v != "" {
		if err := json.Unmarshal([]byte(v), &capabilityArgs); err != nil {
			exit(fmt.Errorf("invalid %s: %w", envCapabilityArgs, err))
		}
	}

	var cniArgs [][2]string
	if v := os.Getenv(envCNIArgs); v != "" {
		if cniArgs, err = parseCNIArgs(v); err != nil {
			exit(err)
		}
	}

	// As upstream: an unset CNI_IFNAME means eth0 (a set-but-empty one is
	// passed through and rejected by libcni's interface name validation).
	ifName, ok := os.LookupEnv(envIfName)
	if !ok {
		ifName = defaultIfName
	}

	netns, err := filepath.Abs(netnsArg)
	if err != nil {
		exit(err)
	}

	paths := filepath.SplitList(os.Getenv(envCNIPath))
	// An empty cache dir makes libcni fall back to libcni.CacheDir (/var/lib/cni).
	cninet := libcni.NewCNIConfigWithCacheDir(paths, os.Getenv(envCacheDir), nil)

	rt := &libcni.RuntimeConf{
		ContainerID:    containerIDFor(netns),
		NetNS:          netns,
		IfName:         ifName,
		Args:           cniArgs,
		CapabilityArgs: capabilityArgs,
	}

	ctx := context.Background()
	switch verb {
	case "add":
		result, err := cninet.AddNetworkList(ctx, netconf, rt)
		if result != nil {
			_ = result.Print()
		}
		exit(err)
	case "check":
		exit(cninet.CheckNetworkList(ctx, netconf, rt))
	case "del":
		exit(cninet.DelNetworkList(ctx, netconf, rt))
	case "gc":
		var valid []gcAttachment
		if v := os.Getenv(envValidAttachments); v != "" {
			if err := json.Unmarshal([]byte(v), &valid); err != nil {
				exit(fmt.Errorf("invalid %s: %w", envValidAttachments, err))
			}
			if valid == nil {
				// "null" still means "the runtime sent a list": an empty one.
				valid = []gcAttachment{}
			}
		}
		exit(gcList(ctx, netconf, paths, valid))
	case "status":
		exit(statusList(ctx, netconf, paths))
	}
}
