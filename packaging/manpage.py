#!/usr/bin/env python3
"""Man pages for the sluice package, from what the project already writes.

    manpage.py help VERSION < help.txt   > sluice.1       (from `sluice --help`)
    manpage.py config VERSION < config.md > sluice.ini.5  (from docs/config.md)

Standard library only. The date in the header is $SOURCE_DATE_EPOCH when
set (reproducible builds), else today.
"""

import datetime
import os
import re
import sys


def today():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        when = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    else:
        when = datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d")


# Typographic characters as groff's named glyphs, which every output device
# has (an ASCII terminal under LC_ALL=C too); others as \[uXXXX].
GLYPHS = {
    "\u2026": "\\&.\\&.\\&.",
    "\u2014": "\\(em",
    "\u2013": "\\(en",
    "\u2018": "\\(oq",
    "\u2019": "\\(cq",
    "\u201c": "\\(lq",
    "\u201d": "\\(rq",
    "\u2192": "\\(->",
    "\u2190": "\\(<-",
    "\u2265": "\\(>=",
    "\u2264": "\\(<=",
    "\u00d7": "\\(mu",
    "\u00a0": "\\~",
}


def escape(text, minus=False):
    """Plain text for a roff text line: backslashes escaped, typographic
    characters as named glyphs; with `minus`, '-' as an ASCII minus."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\e")
        elif c == "-" and minus:
            out.append("\\-")
        elif ord(c) > 127:
            out.append(GLYPHS.get(c, "\\[u%04X]" % ord(c)))
        else:
            out.append(c)
    return "".join(out)


def line(text):
    """One roff text line: guard a leading '.' or "'"."""
    if text.startswith((".", "'")):
        return "\\&" + text
    return text


def literal(text):
    """Text that must survive copy and paste (options, keys, values): ASCII
    hyphen-minus, not a typographic hyphen."""
    return escape(text, minus=True)


def inline(text):
    """Markdown inline markup to roff font escapes: `code` and **bold** in
    bold, *emphasis* in italics, [text](url) as its text."""
    out = []
    pos = 0
    pattern = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\(([^)]+)\)|(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")
    for m in pattern.finditer(text):
        out.append(escape(text[pos:m.start()]))
        code, bold, link_text, _url, emph = m.groups()
        if code is not None:
            out.append("\\fB" + literal(code) + "\\fR")
        elif bold is not None:
            out.append("\\fB" + escape(bold) + "\\fR")
        elif link_text is not None:
            out.append(escape(link_text))
        else:
            out.append("\\fI" + escape(emph) + "\\fR")
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def header(name, section, version, manual):
    return [
        '.TH "%s" "%s" "%s" "sluice %s" "%s"' % (name, section, today(), version, manual),
        ".nh",
        ".ad l",
    ]


# --- sluice(1) from `sluice --help` -----------------------------------------

SIGNALS = [
    ("HUP", "Reload the configuration file and the auth_file. Pool sizes, "
            "timeouts, passwords and databases apply to running pools."),
    ("TERM", "Stop accepting clients; exit when the last client has gone."),
    ("INT", "Stop accepting clients and new transactions; exit once no "
            "server connection is lent to a client (the systemd unit's stop signal)."),
    ("QUIT", "Exit at once."),
    ("USR1", "Pause: hold new transactions until USR2."),
    ("USR2", "Resume after USR1."),
]


def help_to_man(text, version):
    lines = text.rstrip("\n").split("\n")
    about = lines[0].strip() if lines else "PostgreSQL connection pooler"
    usage = ""
    sections = {}  # "Arguments" / "Options" -> [(term, description)]
    current = None
    for raw in lines[1:]:
        if raw.startswith("Usage:"):
            usage = raw[len("Usage:"):].strip()
            current = None
        elif re.match(r"^[A-Z][A-Za-z ]*:$", raw):
            current = raw[:-1]
            sections[current] = []
        elif current and raw.strip():
            indent = len(raw) - len(raw.lstrip())
            m = re.match(r"^ +([-<\[]\S*.*?)(?: {2,}(\S.*))?$", raw)
            # An entry starts with an option or an argument, indented 2
            # (6 for a long option alone); a wrapped description is deeper.
            if m and indent <= 6:
                sections[current].append([m.group(1), m.group(2) or ""])
            elif sections[current]:
                # A wrapped description continues on a deeper indent.
                entry = sections[current][-1]
                entry[1] = (entry[1] + " " + raw.strip()).strip()

    out = header("SLUICE", "1", version, "User Commands")
    out += [".SH NAME", "sluice \\- " + escape(about)]
    out += [".SH SYNOPSIS"]
    words = usage.split()
    synopsis = []
    for word in words:
        if word == "sluice":
            synopsis.append("\\fBsluice\\fR")
        else:
            synopsis.append("\\fI" + literal(word) + "\\fR")
    out.append(line(" ".join(synopsis) if synopsis else "\\fBsluice\\fR \\fICONFIG\\fR"))
    out += [
        ".SH DESCRIPTION",
        "\\fBsluice\\fR pools client connections to PostgreSQL servers. It reads "
        "PgBouncer's configuration file format unchanged, takes PgBouncer's "
        "command line flags and signals, and serves PgBouncer's admin console "
        "on the virtual database \\fBpgbouncer\\fR.",
        ".PP",
        "The configuration file and every key in it are described in "
        "\\fBsluice.ini\\fR(5).",
    ]
    for title in ("Arguments", "Options"):
        entries = sections.get(title)
        if not entries:
            continue
        out.append(".SH " + title.upper())
        for term, description in entries:
            out += [".TP", line(render_term(term)), line(escape(description) or "\\&")]
    out.append(".SH SIGNALS")
    for name, description in SIGNALS:
        out += [".TP", "\\fBSIG" + name + "\\fR", line(escape(description))]
    out += [
        ".SH FILES",
        ".TP",
        "\\fI/etc/sluice/sluice.ini\\fR",
        "The configuration file the Debian package and its systemd unit use.",
        ".TP",
        "\\fI/etc/sluice/userlist.txt\\fR",
        "The default auth_file: one \\fB\"user\" \"password\"\\fR line per user.",
        ".TP",
        "\\fI/run/sluice/.s.PGSQL.6432\\fR",
        "The Unix socket (unix_socket_dir and listen_port).",
        ".SH EXIT STATUS",
        "0 after a clean shutdown or a valid \\fB\\-\\-check\\-config\\fR; 1 when the "
        "configuration cannot be read or is invalid, or sluice cannot start.",
        ".SH SEE ALSO",
        "\\fBsluice.ini\\fR(5), \\fBpgbouncer\\fR(1), \\fBpsql\\fR(1), \\fBsystemctl\\fR(1)",
    ]
    return "\n".join(out) + "\n"


def render_term(term):
    """'-d, --daemon' -> bold options; '<USER>' or '<CONFIG>' -> italics."""
    parts = []
    for piece in re.split(r"(\s+|,)", term):
        if not piece:
            continue
        if piece.startswith("<") and piece.endswith(">"):
            parts.append("\\fI" + literal(piece[1:-1]) + "\\fR")
        elif piece.startswith("-"):
            parts.append("\\fB" + literal(piece) + "\\fR")
        else:
            parts.append(escape(piece))
    return "".join(parts)


# --- sluice.ini(5) from docs/config.md --------------------------------------

def split_row(row):
    cells = row.strip()
    if cells.startswith("|"):
        cells = cells[1:]
    if cells.endswith("|"):
        cells = cells[:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", cells)]


def table_to_man(rows):
    """A table as a tagged list: the first column is the tag; the last
    (the description) is the paragraph; the columns between become
    'Header: value.' after it."""
    head = split_row(rows[0])
    out = []
    for row in rows[2:]:
        cells = split_row(row)
        cells += [""] * (len(head) - len(cells))
        out += [".TP", line(inline(cells[0]))]
        body = inline(cells[-1]) if len(cells) > 1 else ""
        out.append(line(body or "\\&"))
        extras = [
            "%s: %s." % (escape(name), inline(value).rstrip("."))
            for name, value in zip(head[1:-1], cells[1:-1])
        ]
        if extras:
            out += [".br", line(" ".join(extras))]
    return out


def config_to_man(text, version):
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    lines = text.split("\n")
    out = header("SLUICE.INI", "5", version, "File Formats")
    out += [
        ".SH NAME",
        "sluice.ini \\- configuration file of sluice (pgbouncer.ini format)",
        ".SH SYNOPSIS",
        "\\fI/etc/sluice/sluice.ini\\fR",
        ".SH DESCRIPTION",
    ]
    i = 0
    paragraph = []
    in_list = False

    def flush():
        nonlocal paragraph
        if paragraph:
            out.append(line(inline(" ".join(paragraph))))
            paragraph = []

    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if raw.startswith("# "):
            i += 1
            continue
        if raw.startswith("#"):
            flush()
            level = len(raw) - len(raw.lstrip("#"))
            title = raw[level:].strip()
            out.append((".SH " if level == 2 else ".SS ") + '"' + inline(title).upper().replace('"', "") + '"')
            in_list = False
        elif stripped.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(lines[i])
                i += 1
            out += table_to_man(rows)
            out.append(".PP")
            in_list = False
            continue
        elif re.match(r"^\s*[-*] ", raw):
            flush()
            out += [".IP \\(bu 2"]
            paragraph = [re.sub(r"^\s*[-*] ", "", raw).strip()]
            in_list = True
        elif not stripped:
            flush()
            if in_list:
                out.append(".PP")
                in_list = False
            elif out[-1] not in (".PP",) and not out[-1].startswith((".SH", ".SS")):
                out.append(".PP")
        else:
            paragraph.append(stripped)
        i += 1
    flush()
    while out and out[-1] == ".PP":
        out.pop()
    out += [
        ".SH FILES",
        ".TP",
        "\\fI/etc/sluice/sluice.ini\\fR",
        "The configuration the Debian package installs (a conffile) and its systemd unit reads.",
        ".SH SEE ALSO",
        "\\fBsluice\\fR(1)",
    ]
    # Drop a .PP that directly follows a section heading or precedes one.
    cleaned = []
    for item in out:
        if item == ".PP" and cleaned and (cleaned[-1].startswith((".SH", ".SS", ".PP", ".TH"))):
            continue
        if item.startswith((".SH", ".SS")) and cleaned and cleaned[-1] == ".PP":
            cleaned.pop()
        cleaned.append(item)
    return "\n".join(cleaned) + "\n"


def main(argv):
    if len(argv) != 3 or argv[1] not in ("help", "config"):
        sys.stderr.write(__doc__)
        return 2
    text = sys.stdin.read()
    if argv[1] == "help":
        sys.stdout.write(help_to_man(text, argv[2]))
    else:
        sys.stdout.write(config_to_man(text, argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
