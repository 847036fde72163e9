package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// rsvgConvert returns rsvg-convert, which the timeline tests draw the
// picture with; without it they skip, or fail under CI=true.
func rsvgConvert(t *testing.T) string {
	t.Helper()
	return testenv.MustHaveCommand(t, "rsvg-convert", "librsvg2-bin")
}

// drawSVG renders svg to an image with rsvg-convert.
func drawSVG(t *testing.T, rsvg string, svg []byte) image.Image {
	t.Helper()
	cmd := exec.Command(rsvg, "--format", "png")
	cmd.Stdin = bytes.NewReader(svg)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("rsvg-convert: %v\n%s", err, stderr.String())
	}
	img, err := png.Decode(&out)
	if err != nil {
		t.Fatalf("rsvg-convert's PNG: %v", err)
	}
	return img
}

// rowBands finds, in the SVG, where each rank's row lies: the y of its
// "rank N" label, which is centred on the row.
func rowBands(t *testing.T, svg []byte) map[int]int {
	t.Helper()
	rows := map[int]int{}
	d := xml.NewDecoder(bytes.NewReader(svg))
	var y string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the timeline is not XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			y = ""
			for _, a := range tok.Attr {
				if tok.Name.Local == "text" && a.Name.Local == "y" {
					y = a.Value
				}
			}
		case xml.CharData:
			if n, ok := strings.CutPrefix(string(tok), "rank "); ok && y != "" {
				rank, err1 := strconv.Atoi(n)
				yy, err2 := strconv.Atoi(y)
				if err1 == nil && err2 == nil {
					rows[rank] = yy
				}
			}
		}
	}
	return rows
}

// countColour counts the pixels of img within rows [y0, y1), right of
// x0, that are within a few levels of the colour hex (#rrggbb).
func countColour(img image.Image, x0, y0, y1 int, hex string) int {
	want, _ := strconv.ParseUint(strings.TrimPrefix(hex, "#"), 16, 32)
	wr, wg, wb := int(want>>16), int(want>>8&0xff), int(want&0xff)
	near := func(a, b int) bool { return a-b <= 6 && b-a <= 6 }
	n := 0
	b := img.Bounds()
	for y := max(y0, b.Min.Y); y < min(y1, b.Max.Y); y++ {
		for x := max(x0, b.Min.X); x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(int(r>>8), wr) && near(int(g>>8), wg) && near(int(bl>>8), wb) {
				n++
			}
		}
	}
	return n
}

// The colours the timeline draws a failed run and a stopped one in
// (elastic/timeline.go).
const (
	failedColour  = "#d62728"
	stoppedColour = "#f0a030"
)

// A night run that failed: rank 1 fails, the group restarts once, rank 1
// fails again. --report draws it, as a page and as an SVG, and the
// picture shows the failures in rank 1's row and the stops in rank 0's.
func TestTimelineReportOfAFailedJob(t *testing.T) {
	rsvg := rsvgConvert(t)
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi
trap 'exit 143' TERM; sleep 30 & wait
`)
	svgOf := map[string][]byte{}
	for _, name := range []string{"night.html", "night.svg"} {
		path := filepath.Join(dir, name)
		j := gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-id", "night-7", "--report", path, w)
		if j.code != 3 {
			t.Fatalf("want exit 3 (rank 1's):\n%s", j)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("no report:\n%s", j)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, fi.Mode().Perm())
		}
		doc, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		svg := doc
		if strings.HasSuffix(name, ".html") {
			if !bytes.HasPrefix(doc, []byte("<!DOCTYPE html>")) || bytes.Contains(doc, []byte("<script")) || bytes.Contains(doc, []byte("src=")) {
				t.Errorf("the page is not a self-contained HTML page:\n%s", doc)
			}
			i, k := bytes.Index(doc, []byte("<svg")), bytes.Index(doc, []byte("</svg>"))
			if i < 0 || k < i {
				t.Fatalf("the page embeds no SVG:\n%s", doc)
			}
			svg = doc[i : k+len("</svg>")]
		}
		svgOf[name] = svg
		for _, want := range []string{"night-7", "failed: rank 1", "exit 3, 1 restarts", "round 0", "rank 1 restarted", "exitcode 3"} {
			if !bytes.Contains(svg, []byte(want)) {
				t.Errorf("%s names no %q:\n%s", name, want, svg)
			}
		}
		// Two starts of each rank: two bars, each with its pid.
		for _, rank := range []string{"0", "1"} {
			if n := len(regexp.MustCompile(`<title>rank `+rank+` pid \d+: `).FindAll(svg, -1)); n != 2 {
				t.Errorf("%s: rank %s has %d bars, want 2:\n%s", name, rank, n, svg)
			}
		}

		img := drawSVG(t, rsvg, svg)
		rows := rowBands(t, svg)
		y0, ok0 := rows[0]
		y1, ok1 := rows[1]
		if !ok0 || !ok1 || len(rows) != 2 {
			t.Fatalf("%s: rows %v, want ranks 0 and 1", name, rows)
		}
		const half, labels = 12, 90
		if n := countColour(img, labels, y1-half, y1+half, failedColour); n < 200 {
			t.Errorf("%s: %d pixels of the failure's colour in rank 1's row, want its bars", name, n)
		}
		if n := countColour(img, labels, y0-half, y0+half, failedColour); n != 0 {
			t.Errorf("%s: %d pixels of the failure's colour in rank 0's row, which only gorun stopped", name, n)
		}
		if n := countColour(img, labels, y0-half, y0+half, stoppedColour); n < 200 {
			t.Errorf("%s: %d pixels of the stop's colour in rank 0's row", name, n)
		}
		b := img.Bounds()
		if white := countColour(img, 0, 0, b.Max.Y, "#ffffff"); white > b.Dx()*b.Dy()*97/100 {
			t.Errorf("%s: the picture is nearly blank (%d of %d pixels white)", name, white, b.Dx()*b.Dy())
		}
	}
	if len(svgOf) != 2 {
		t.Errorf("want both forms, got %d", len(svgOf))
	}
}

// --report takes .html or .svg only, and never writes through a symlink
// planted at its name.
func TestTimelineReportRefusals(t *testing.T) {
	dir := t.TempDir()
	j := gorun(t, nil, "--report", filepath.Join(dir, "r.png"), "--no-python", "true")
	if j.code != 2 || !strings.Contains(j.stderr, "FILE.html or FILE.svg") {
		t.Errorf("--report r.png: want a usage error (exit 2):\n%s", j)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "r.svg")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	j = gorun(t, nil, "--report", link, "--no-python", "true")
	if j.code == 0 || !strings.Contains(j.stderr, "--report") {
		t.Errorf("--report through a symlink: want a failure that names --report:\n%s", j)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Errorf("the symlink's target was written: %q, %v", b, err)
	}
}

// A hung job's timeline marks the hang, with a ring on each stuck rank.
func TestTimelineReportOfAHang(t *testing.T) {
	rsvg := rsvgConvert(t)
	path := filepath.Join(t.TempDir(), "hang.svg")
	j := gorun(t, nil, "--nproc-per-node", "2", "--hang-timeout", "2s", "--report", path, bin("hang"), "-hang-after", "5")
	if j.code == 0 {
		t.Fatalf("a hung job succeeded:\n%s", j)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no report: %v\n%s", err, j)
	}
	if !bytes.Contains(svg, []byte("hang: ranks 0,1")) {
		t.Errorf("the timeline marks no hang of ranks 0 and 1:\n%s", svg)
	}
	img := drawSVG(t, rsvg, svg)
	const hangColour, half, labels = "#9b30d0", 12, 90
	rows := rowBands(t, svg)
	if len(rows) != 2 {
		t.Fatalf("rows %v, want ranks 0 and 1", rows)
	}
	for rank, y := range rows {
		// More than the hang's line, 2 pixels wide: its ring too.
		if n := countColour(img, labels, y-half, y+half, hangColour); n < 4*half+40 {
			t.Errorf("rank %d: %d pixels of the hang's colour in its row, want its ring", rank, n)
		}
	}
}
