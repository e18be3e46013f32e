"""Plain text from Debian documentation packages, split into training and
held-out evaluation families (docs/training.md, "Diverse text").

    bash weights_tools/fetch_text.sh            # apt-get download + dpkg-deb -x into the cache
    /usr/bin/python3 weights_tools/text_corpus.py --cache ~/.cache/drt-text

writes <cache>/text/<family>.txt, one file per family, documents separated by
a blank line. The families are disjoint in package and in kind of writing:

    training   python-docs   Python 3.11 manuals (reStructuredText sources)
               perl-pod      Perl manuals (POD)
               man-pages     Linux man pages, sections 1-8 (roff)
               gcide         GNU Collaborative International Dictionary of English
    held-out   handbook      The Debian Administrator's Handbook (a book, HTML)
               fortunes      fortune(6) quotations, jokes and literature excerpts

Nothing here is committed except a small handbook excerpt
(tests/fixtures/heldout-text/debian_handbook_excerpt.txt, GPL-2+ or CC-BY-SA-3.0); the
training text and the rest of the held-out text stay in the cache.
"""
import argparse
import glob
import gzip
import html
import os
import re
import sys

TRAIN_FAMILIES = ("python-docs", "perl-pod", "man-pages", "gcide")
HELDOUT_FAMILIES = ("handbook", "fortunes")

# family -> (package(s), what it is, licence as stated in the package's copyright file)
SOURCES = {
    "python-docs": (["python3.11-doc"], "Python 3.11 documentation", "PSF-2.0"),
    "perl-pod": (["perl-doc"], "Perl 5.36 manuals", "GPL-1+ or Artistic"),
    "man-pages": (["manpages", "manpages-dev"], "Linux man-pages 6.03",
                  "per page: GPL-2+, BSD, MIT and the man-pages 'verbatim' licence"),
    "gcide": (["dict-gcide"], "GCIDE 0.48", "GPL-3+"),
    "handbook": (["debian-handbook"], "The Debian Administrator's Handbook (en-US)",
                 "GPL-2+ or CC-BY-SA-3.0"),
    "fortunes": (["fortunes", "fortunes-min"], "fortune-mod data files",
                 "BSD (fortune-mod); the quotations belong to their authors"),
}


def squeeze(text):
    """Collapse runs of blank lines and trailing spaces; keep paragraph breaks."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    out, blank = [], False
    for ln in lines:
        if not ln.strip():
            if not blank and out:
                out.append("")
            blank = True
        else:
            out.append(ln)
            blank = False
    return "\n".join(out).strip() + "\n"


def strip_html(text):
    text = re.sub(r"(?is)<(script|style|head)\b.*?</\1>", " ", text)
    text = re.sub(r"(?i)<br\s*/?>|</p>|</div>|</h\d>|</li>|</tr>|</pre>", "\n", text)
    text = re.sub(r"(?s)<[^>]*>", "", text)
    text = re.sub(r"(?m)^[ \t]+", "", text)  # the HTML's indentation
    return html.unescape(text)


def strip_rst(text):
    text = re.sub(r"(?m)^\.\. _[^:]*:\s*$", "", text)                 # labels
    text = re.sub(r"(?m)^\.\. (index|highlight|toctree|module|currentmodule|sectionauthor|moduleauthor)::.*(\n   +.*)*", "", text)
    text = re.sub(r"(?m)^[*=\-~^\"#+]{4,}\s*$", "", text)                # section underlines
    text = re.sub(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)  # :role:`text <target>`
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_{0,2}", r"\1", text)
    text = re.sub(r"(?m)^\.\. ([a-z-]+)::\s*", r"\1: ", text)          # other directives: keep their text
    return text


def strip_pod(text):
    text = re.sub(r"(?m)^=(pod|cut|over|back|begin|end|for|encoding)\b.*$", "", text)
    text = re.sub(r"(?m)^=head\d\s+", "", text)
    text = re.sub(r"(?m)^=item\s+", "* ", text)
    for _ in range(3):  # nested formatting codes: B<I<x>>
        text = re.sub(r"[BICFSXZEL]<<+\s(.*?)\s>>+", r"\1", text)
        text = re.sub(r"[BICFSXZL]<([^<>]*)>", lambda m: m.group(1).split("|")[0], text)
    text = re.sub(r"E<lt>", "<", text)
    text = re.sub(r"E<gt>", ">", text)
    text = re.sub(r"E<[^>]*>", "", text)
    return text


def strip_roff(text):
    out = []
    for ln in text.splitlines():
        if ln.startswith(('.\\"', "'\\\"", '.\\}', ".so ")):
            continue
        if ln.startswith((".SH", ".SS")):
            out.append("")
            out.append(ln[3:].strip().strip('"'))
            continue
        if ln.startswith((".B ", ".I ", ".BR ", ".IR ", ".RB ", ".RI ", ".BI ", ".IB ", ".SM ")):
            words = re.findall(r'"[^"]*"|\S+', ln.split(None, 1)[1] if " " in ln else "")
            out.append("".join(w.strip('"') for w in words) if ln[1:3] in ("BR", "IR", "RB", "RI", "BI", "IB")
                       else " ".join(w.strip('"') for w in words))
            continue
        if ln.startswith((".PP", ".P", ".LP", ".TP", ".IP", ".sp", ".br")):
            out.append("")
            if ln.startswith(".IP ") and len(ln) > 4:
                out.append(ln[4:].strip().strip('"'))
            continue
        if ln.startswith((".", "'")):
            continue
        out.append(ln)
    text = "\n".join(out)
    text = re.sub(r"\\f[BIRP]|\\f\(..|\\f\[[^\]]*\]", "", text)
    text = re.sub(r"\\\((em|en)", "-", text)
    text = re.sub(r"\\\(aq", "'", text)
    text = re.sub(r"\\\((lq|rq|dq)", '"', text)
    text = re.sub(r"\\\[[a-z]+\]|\\\(..", "", text)
    text = text.replace("\\-", "-").replace("\\e", "\\").replace("\\&", "").replace("\\ ", " ")
    text = re.sub(r"\\[|^%c]", "", text)
    return text


def strip_gcide(text):
    # dictd's plain text; drop the database header and the file banners.
    text = re.sub(r"(?s)^.*?Begin file 1 of", "Begin file 1 of", text, count=1)
    text = re.sub(r"(?m)^.*(Begin|End) file \d+ of \d+.*$", "", text)
    return text


def read(path):
    opener = gzip.open if path.endswith((".gz", ".dz")) else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def documents(pkg_root, family):
    """Yields (name, plain text) for every document of `family`."""
    if family == "python-docs":
        base = os.path.join(pkg_root, "python3.11-doc/usr/share/doc/python3.11/html/_sources")
        for p in sorted(glob.glob(base + "/**/*.rst.txt", recursive=True)):
            if "/whatsnew/" in p or "/c-api/" in p:   # changelog lists and C signatures: little prose
                continue
            yield p, strip_rst(read(p))
    elif family == "perl-pod":
        for p in sorted(glob.glob(os.path.join(pkg_root, "perl-doc/usr/share/perl/*/pod/*.pod"))):
            if re.search(r"perl5\d+delta|perldelta|perlhist|perltoc", p):
                continue
            yield p, strip_pod(read(p))
    elif family == "man-pages":
        for pkg in ("manpages", "manpages-dev"):
            for p in sorted(glob.glob(os.path.join(pkg_root, pkg, "usr/share/man/man*/*.gz"))):
                yield p, strip_roff(read(p))
    elif family == "gcide":
        p = os.path.join(pkg_root, "dict-gcide/usr/share/dictd/gcide.dict.dz")
        yield p, strip_gcide(read(p))
    elif family == "handbook":
        base = os.path.join(pkg_root, "debian-handbook/usr/share/doc/debian-handbook/html/en-US")
        for p in sorted(glob.glob(base + "/*.html")):
            if os.path.basename(p) in ("index.html", "ix01.html"):
                continue
            yield p, strip_html(read(p))
    elif family == "fortunes":
        for pkg in ("fortunes", "fortunes-min"):
            for p in sorted(glob.glob(os.path.join(pkg_root, pkg, "usr/share/games/fortunes/*"))):
                if "." in os.path.basename(p) or os.path.isdir(p):   # skip .dat indexes and .u8 links
                    continue
                if os.path.basename(p) in ("ascii-art", "art"):
                    continue
                yield p, read(p).replace("\n%\n", "\n\n")
    else:
        raise ValueError(f"unknown family {family!r}; known: {TRAIN_FAMILIES + HELDOUT_FAMILIES}")


def build(cache, families):
    pkg_root = os.path.join(cache, "pkg")
    out_dir = os.path.join(cache, "text")
    os.makedirs(out_dir, exist_ok=True)
    for family in families:
        missing = [p for p in SOURCES[family][0] if not os.path.isdir(os.path.join(pkg_root, p))]
        if missing:
            raise FileNotFoundError(f"{family}: packages {missing} not unpacked under {pkg_root} "
                                    f"(run weights_tools/fetch_text.sh first)")
        n_docs, parts = 0, []
        for _, text in documents(pkg_root, family):
            text = squeeze(text)
            if len(text) > 200:
                parts.append(text)
                n_docs += 1
        body = "\n".join(parts)
        with open(os.path.join(out_dir, family + ".txt"), "w", encoding="utf-8") as f:
            f.write(body)
        print(f"{family:12s} {n_docs:5d} documents {len(body.encode()) / 1e6:7.2f} MB -> {out_dir}/{family}.txt")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/drt-text"))
    p.add_argument("--families", default=",".join(TRAIN_FAMILIES + HELDOUT_FAMILIES))
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in SOURCES:
            p.error(f"unknown family {f!r}; known: {', '.join(SOURCES)}")
    build(args.cache, families)
    return 0


if __name__ == "__main__":
    sys.exit(main())
