package htmlreport

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromium finds Debian's chromium (or LLMGW_CHROMIUM). Absent, the test
// skips, and fails under CI=true (make report-deps installs it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LLMGW_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (make report-deps)")
	}
	t.Skip("chromium is not installed (make report-deps)")
	return ""
}

// TestSiteInChromium loads every page of a report in one headless
// Chromium: no console error, no exception, no request leaves file://,
// every link and image resolves to a file (and its anchor to an element),
// and the matrix filter hides the rows it should.
func TestSiteInChromium(t *testing.T) {
	bin := chromium(t)
	dir := writeSite(t, fixture(t))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin),
		chromedp.NoSandbox, chromedp.Flag("disable-gpu", true), chromedp.UserDataDir(t.TempDir()))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelT()

	var mu sync.Mutex
	var problems []string
	listen := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range e.Args {
					args = append(args, fmt.Sprintf("%s%s", a.Value, a.Description))
				}
				problems = append(problems, fmt.Sprintf("console %s: %s", e.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+(&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				problems = append(problems, "log: "+e.Entry.Text+" "+e.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			if u, err := url.Parse(e.Request.URL); err != nil || (u.Scheme != "file" && u.Scheme != "data") {
				problems = append(problems, "external request: "+e.Request.URL)
			}
		}
	})
	if listen != nil {
		t.Fatal(listen)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}

	// The links of a page, resolved by the browser; the check of each
	// target is done on the file system.
	const linksJS = `Array.from(document.querySelectorAll("a[href], img[src]")).map(e => e.href ? (e.href.baseVal !== undefined ? new URL(e.href.baseVal, document.baseURI).href : e.href) : e.src)`
	for _, p := range sitePages(t, dir) {
		if err := chromedp.Do(ctx, chromedp.Navigate("file://"+p), chromedp.WaitReady("footer")); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		links, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](linksJS))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, l := range links {
			u, err := url.Parse(l)
			if err != nil || u.Scheme != "file" {
				t.Errorf("%s: link %q is not a file in the site", p, l)
				continue
			}
			if !strings.HasPrefix(u.Path, dir+"/") {
				t.Errorf("%s: link %q leaves the site", p, l)
			}
			if _, err := os.Stat(u.Path); err != nil {
				t.Errorf("%s: link %q does not resolve: %v", p, l, err)
				continue
			}
			if u.Fragment == "" {
				continue
			}
			if err := chromedp.Do(ctx, chromedp.Navigate(l), chromedp.WaitReady("footer")); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, "#"+u.Fragment)))
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			if n != 1 {
				t.Errorf("%s: link %q: %d elements with that id", p, l, n)
			}
		}
	}

	// The filter: the form appears, and choosing an engine leaves its rows.
	const countJS = `Array.from(document.querySelectorAll("#matrix tbody tr")).filter(r => !r.hidden).length`
	count := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](countJS))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+filepath.Join(dir, "index.html")), chromedp.WaitVisible("#f-engine")); err != nil {
		t.Fatal(err)
	}
	total := count()
	if err := chromedp.Do(ctx, chromedp.SetValue("#f-engine", "vllm")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("f-engine").dispatchEvent(new Event("change"))`)); err != nil {
		t.Fatal(err)
	}
	visible := count()
	if total != 3 || visible != 1 {
		t.Errorf("filter: %d rows, after engine=vllm %d visible; want 3, 1", total, visible)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue("#f-engine", ""), chromedp.SendKeys("#f-text", "BLOCKED")); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Errorf("search BLOCKED: %d rows visible, want 1", n)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
}
