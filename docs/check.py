#!/usr/bin/env python3
"""The docs test: run the runnable examples of the documentation and check its links.

    python3 docs/check.py --binary PATH [--redis-server PATH] [--no-run] [--list-external] [FILES...]

Without FILES it reads README.md, CHANGELOG.md and every docs/**/*.md for examples, and those
plus examples/README.md and deploy/**/README.md for links. It exits non-zero when an example's
output differs from the page or a link is dead, and prints what differs, naming file:line.
Python 3.11 standard library only.

Runnable examples
-----------------
A fenced block runs when the line right before its opening fence is exactly
``<!-- runnable -->`` (the service on its embedded store) or ``<!-- runnable: redis -->`` (the
service on a redis-server this script starts, on a free loopback port, with --save "" and
--appendonly no). In a ``console`` block a line starting with ``$ `` is a command (a line
ending with a backslash continues it on the next line) and the lines up to the next ``$ `` line
are its expected output (stdout and stderr together). A runnable ``sh``/``bash`` block is run as
it stands and must print nothing.

All runnable blocks of one page and one kind run in order in ONE bash session (so variables and
policies carry from block to block) against ONE freshly started service, with the repository
root as working directory, ``ratelimiter`` on PATH (the binary under test) and, for redis
pages, a ``redis-cli`` on PATH that talks to the test's redis-server. Commands write the
service as ``127.0.0.1:8080`` (HTTP), ``127.0.0.1:8081`` (gRPC) and Redis as
``127.0.0.1:6379``; the script substitutes the real ports in commands and writes the documented
ones back into the output. A page's run is stopped after --timeout seconds (default 120).

The masking rule
----------------
Values that differ on every run are replaced by a placeholder, token by token, on BOTH sides
(the page's expected text and the real output) before comparing, so a page keeps realistic
values and everything else on the line is still compared:

  1. RFC 3339 timestamps (``2026-12-02T04:27:19.213817Z``)          -> ``<time>``
  2. HTTP dates (``Wed, 02 Dec 2026 04:27:19 GMT``)                  -> ``<date>``
  3. the number of a JSON field whose name ends in ``_after_ms`` or
     ``_in_ms``, the counting-down times of an answer
     (``"reset_after_ms":11308``)                                    -> ``"reset_after_ms":<ms>``
     (a policy's own ``window_ms`` or ``lease_ms`` is compared as it is)
  4. the value of the headers ``retry-after`` and ``content-length``
     (any case)                                                      -> ``retry-after: <n>``
  5. ``t=`` numbers (the ``RateLimit`` header's reset)                -> ``t=<n>``
  6. runs of 16 or more hex digits (ETag and ``policy-etag``
     generations, tickets' nonces and tags, lease and override ids)  -> ``<hex>``
  7. numbers of 13 or more digits (epoch milliseconds and
     microseconds, as in tickets)                                    -> ``<big>``

Besides, the header lines of an HTTP response (from an ``HTTP/1.1 200 OK`` line to the first
empty line) are compared in sorted order, because the service does not write its headers in a
fixed order. Nothing else is forgiven: counts, ``remaining``, statuses, versions, messages and
key names must match exactly. Spaces at the end of a line, and a newline missing at the end of
a command's output, are not differences.

Links
-----
Every relative Markdown link or image (inline ``[text](target)`` and reference definitions
``[name]: target``, outside code) must name an existing file or directory, relative to the page
(a target starting with ``/`` is relative to the repository root). A ``#anchor`` on a Markdown
page must be the GitHub slug of one of its headings (lower-cased; characters other than
letters, digits, spaces, ``-`` and ``_`` dropped; spaces become ``-``; a repeated heading gets
``-1``, ``-2``...) or an ``id``/``name`` given in HTML on the page. http(s) and mailto links are
not fetched; --list-external prints them.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC_HTTP = "127.0.0.1:8080"
DOC_GRPC = "127.0.0.1:8081"
DOC_REDIS = "127.0.0.1:6379"
MARKERS = {"<!-- runnable -->": "embedded", "<!-- runnable: redis -->": "redis"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")


# --------------------------------------------------------------------------------- masking

_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(?:\.\d+)?(?:[Zz]|[+-]\d\d:?\d\d)"), "<time>"),
    (
        re.compile(
            r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
            r" \d{4} \d\d:\d\d:\d\d GMT"
        ),
        "<date>",
    ),
    (re.compile(r'("[A-Za-z0-9_]*_(?:after|in)_ms"\s*:\s*)-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?'), r"\1<ms>"),
    (re.compile(r"(?im)^((?:retry-after|content-length)\s*:\s*)\d+"), r"\1<n>"),
    (re.compile(r"(?<![A-Za-z0-9_])t=\d+"), "t=<n>"),
    (re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{16,}(?![0-9A-Za-z])"), "<hex>"),
    (re.compile(r"(?<![0-9A-Za-z])\d{13,}(?![0-9A-Za-z])"), "<big>"),
]
_STATUS_LINE = re.compile(r"^HTTP/\d(?:\.\d)? \d{3}\b")


def mask_line(line: str) -> str:
    """Applies the masking rule (see the module's documentation) to one line."""
    for pattern, replacement in _MASKS:
        line = pattern.sub(replacement, line)
    return line


def normalize(text: str) -> list[str]:
    """The lines to compare: masked, with each HTTP response's header lines sorted."""
    lines = [mask_line(l.rstrip()) for l in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if _STATUS_LINE.match(lines[i]):
            j = i + 1
            while j < len(lines) and lines[j] != "":
                j += 1
            out.extend(sorted(lines[i + 1 : j], key=lambda h: (h.split(":", 1)[0].lower(), h)))
            i = j
            continue
        i += 1
    return out


# --------------------------------------------------------------------------------- parsing


@dataclass
class Command:
    line: int  # 1-based line of the `$ ` in the file
    text: str  # the command as bash reads it (continuations included)
    expected: str  # expected output, lines joined with "\n" (no trailing newline)
    cmd_lines: int = 1  # lines the command takes on the page
    out_lines: int = 0  # lines its expected output takes on the page (-1: an sh block)


@dataclass
class Block:
    kind: str  # "embedded" or "redis"
    lang: str
    line: int  # line of the opening fence
    commands: list[Command] = field(default_factory=list)


class PageError(Exception):
    pass


def fenced_blocks(lines: list[str]):
    """Yields (opening fence index, info word, body lines, closing index) of each fenced block."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(2)
        j = i + 1
        while j < len(lines):
            close = re.match(r"^\s*(" + re.escape(fence[0]) + r"{" + str(len(fence)) + r",})\s*$", lines[j])
            if close:
                break
            j += 1
        yield i, m.group(3).lower(), lines[i + 1 : j], j
        i = j + 1


def runnable_blocks(path: Path, text: str) -> list[Block]:
    lines = text.split("\n")
    blocks = []
    for start, lang, body, _ in fenced_blocks(lines):
        marker = lines[start - 1].strip() if start > 0 else ""
        if marker.startswith("<!-- runnable") and marker not in MARKERS:
            raise PageError(f"{path}:{start}: unknown marker {marker!r} (known: {', '.join(MARKERS)})")
        if marker not in MARKERS:
            continue
        block = Block(MARKERS[marker], lang, start + 1)
        if lang in ("sh", "bash", "shell"):
            block.commands.append(Command(start + 2, "\n".join(body), "", len(body), -1))
        elif lang == "console":
            k = 0
            while k < len(body):
                raw = body[k]
                lineno = start + 2 + k
                if raw.startswith("$ ") or raw == "$":
                    cmd = [raw[2:]]
                    while cmd[-1].endswith("\\") and k + 1 < len(body):
                        k += 1
                        cmd.append(body[k])
                    block.commands.append(Command(lineno, "\n".join(cmd), "", len(cmd)))
                elif not block.commands:
                    raise PageError(f"{path}:{lineno}: output before the first `$ ` command of a runnable block")
                else:
                    c = block.commands[-1]
                    c.expected = raw if c.out_lines == 0 else c.expected + "\n" + raw
                    c.out_lines += 1
                k += 1
            if not block.commands:
                raise PageError(f"{path}:{start + 1}: a runnable console block without a `$ ` command")
        else:
            raise PageError(f"{path}:{start + 1}: a runnable block must be console or sh, not {lang!r}")
        blocks.append(block)
    return blocks


# --------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen | None, group: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.terminate()
            try:
                proc.wait(5)
                return
            except subprocess.TimeoutExpired:
                proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


class Environment:
    """One service (and its redis-server) for one page and kind; stopped by close()."""

    def __init__(self, kind: str, binary: Path, redis_server: str | None, work: Path):
        self.kind = kind
        self.procs: list[subprocess.Popen] = []
        self.redis_port: int | None = None
        self.log = work / f"service-{kind}.log"
        env = dict(os.environ)
        env.pop("RATELIMITER_CONFIG", None)
        for k in list(env):
            if k.startswith("RATELIMITER__"):
                del env[k]
        if kind == "redis":
            if not redis_server:
                raise SystemExit(
                    "docs/check.py: a page has `<!-- runnable: redis -->` blocks but no redis-server was found;"
                    " install it (Debian: apt-get install -y redis-server) or pass --redis-server PATH"
                )
            self.redis_port = self._start_redis(redis_server, work)
            env["RATELIMITER__REDIS__URL"] = f"redis://127.0.0.1:{self.redis_port}"
        for _ in range(3):
            self.http, self.grpc = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            env["RATELIMITER__SERVER__BIND"] = self.http
            env["RATELIMITER__GRPC__BIND"] = self.grpc
            with open(self.log, "wb") as log:
                proc = subprocess.Popen([str(binary)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
            if wait_ready(f"http://{self.http}/readyz", proc, 15):
                self.procs.append(proc)
                return
            stop(proc)
        self.close()
        raise SystemExit(f"docs/check.py: the service did not become ready; its log:\n{self.log.read_text()[-4000:]}")

    def _start_redis(self, redis_server: str, work: Path) -> int:
        for _ in range(3):
            port = free_port()
            if port == 6379:
                continue
            proc = subprocess.Popen(
                [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(work)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            )
            self.procs.append(proc)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                        s.sendall(b"PING\r\n")
                        if s.recv(64).startswith(b"+PONG"):
                            return port
                except OSError:
                    time.sleep(0.05)
            stop(proc)
        raise SystemExit("docs/check.py: redis-server did not start")

    def substitute(self, command: str) -> str:
        command = command.replace(DOC_HTTP, self.http).replace("localhost:8080", self.http)
        command = command.replace(DOC_GRPC, self.grpc).replace("localhost:8081", self.grpc)
        if self.redis_port:
            command = command.replace(DOC_REDIS, f"127.0.0.1:{self.redis_port}")
        return command

    def unsubstitute(self, output: str) -> str:
        output = output.replace(self.http, DOC_HTTP).replace(self.grpc, DOC_GRPC)
        if self.redis_port:
            output = output.replace(f"127.0.0.1:{self.redis_port}", DOC_REDIS)
        return output

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        self.procs.clear()


def run_session(env: Environment, commands: list[Command], binary: Path, work: Path, timeout: float, cwd: Path):
    """Runs the commands in one bash session; returns [(output or None, exit status)] per command."""
    bindir = work / f"bin-{env.kind}"
    bindir.mkdir(exist_ok=True)
    link = bindir / "ratelimiter"
    if not link.exists():
        link.symlink_to(binary.resolve())
    if env.redis_port:
        cli = shutil.which("redis-cli")
        if cli:
            wrapper = bindir / "redis-cli"
            wrapper.write_text(f'#!/bin/sh\nexec {cli} -h 127.0.0.1 -p {env.redis_port} "$@"\n')
            wrapper.chmod(0o755)
    token = os.urandom(8).hex()
    script = ["exec 2>&1"]
    for i, c in enumerate(commands):
        script.append(env.substitute(c.text))
        script.append(f"printf '\\n@@docs-check-{token} {i} %s\\n' \"$?\"")
    path = work / f"session-{env.kind}.sh"
    path.write_text("\n".join(script) + "\n")
    penv = dict(os.environ)
    penv["PATH"] = f"{bindir}{os.pathsep}{penv.get('PATH', '')}"
    penv["LC_ALL"] = "C.UTF-8"
    proc = subprocess.Popen(["bash", "--noprofile", "--norc", str(path)], cwd=cwd, env=penv,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    try:
        raw, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
    finally:
        # whatever the commands left in the background (a second instance, a sleep) goes too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = raw.decode("utf-8", "replace")
    results: list[tuple[str | None, str]] = []
    pos = 0
    marker = re.compile(r"\n@@docs-check-" + token + r" (\d+) (\d+)\n")
    for i in range(len(commands)):
        m = marker.search(text, pos)
        if not m or int(m.group(1)) != i:
            tail = text[pos:]
            results.append((tail, "timed out" if timed_out else "the session ended here"))
            results.extend((None, "not run") for _ in range(i + 1, len(commands)))
            break
        results.append((text[pos : m.start()], m.group(2)))
        pos = m.end()
    return results


# --------------------------------------------------------------------------------- links

_INLINE_CODE = re.compile(r"(`+)(?:.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\"|\s+'[^']*')?\s*\)")
_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HTML_ID = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str, strip_code: bool = True):
    """Yields (1-based line number, line) of the lines outside fenced code, inline code removed."""
    lines = text.split("\n")
    inside = set()
    for start, _, _, end in fenced_blocks(lines):
        inside.update(range(start, min(end, len(lines) - 1) + 1))
    for i, line in enumerate(lines):
        if i not in inside:
            yield i + 1, _INLINE_CODE.sub("", line) if strip_code else line


def github_slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.replace("`", "")
    text = text.strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path not in cache:
        text = path.read_text(encoding="utf-8")
        found: set[str] = set()
        seen: dict[str, int] = {}
        for _, line in prose_lines(text, strip_code=False):
            m = _HEADING.match(line)
            if m:
                slug = github_slug(m.group(2))
                n = seen.get(slug, 0)
                found.add(slug if n == 0 else f"{slug}-{n}")
                seen[slug] = n + 1
            found.update(_HTML_ID.findall(line))
        cache[path] = found
    return cache[path]


def check_links(files: list[Path], root: Path, external: list[str]) -> list[str]:
    errors = []
    cache: dict[Path, set[str]] = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        for lineno, line in prose_lines(text):
            targets = [m.group(1) for m in _LINK.finditer(line)]
            m = _REFDEF.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                target = target.strip("<>")
                if not target:
                    errors.append(f"{rel}:{lineno}: empty link target")
                    continue
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    if target.startswith(("http://", "https://", "mailto:")):
                        external.append(f"{rel}:{lineno}: {target}")
                    else:
                        errors.append(f"{rel}:{lineno}: unsupported link scheme: {target}")
                    continue
                file_part, _, anchor = target.partition("#")
                file_part = urllib.request.url2pathname(file_part.split("?")[0])
                if file_part.startswith("/"):
                    dest = root / file_part.lstrip("/")
                elif file_part:
                    dest = path.parent / file_part
                else:
                    dest = path
                if not dest.exists():
                    errors.append(f"{rel}:{lineno}: dead link {target!r}: no file {os.path.relpath(dest, root)}")
                    continue
                if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                    if anchor.lower() not in {a.lower() for a in anchors(dest.resolve(), cache)}:
                        errors.append(
                            f"{rel}:{lineno}: dead anchor {target!r}: no heading of "
                            f"{os.path.relpath(dest, root)} has the slug {anchor!r}"
                        )
    return errors


# --------------------------------------------------------------------------------- main


def default_files(root: Path) -> tuple[list[Path], list[Path]]:
    docs = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    run = [p for p in [root / "README.md", root / "CHANGELOG.md", *docs] if p.is_file()]
    links = run + [p for p in [root / "examples" / "README.md", *sorted((root / "deploy").rglob("README.md"))]
                   if p.is_file()]
    return run, links


def check_page(
    path: Path, root: Path, binary: Path, redis_server: str | None, timeout: float, record: bool = False
) -> tuple[int, list[str]]:
    """Runs one page's runnable blocks; returns (commands run, failure messages).

    With record, writes each console command's real output into the page instead of failing."""
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    try:
        blocks = runnable_blocks(rel, path.read_text(encoding="utf-8"))
    except PageError as e:
        return 0, [str(e)]
    failures = []
    count = 0
    recorded: list[tuple[Command, str]] = []
    for kind in ("embedded", "redis"):
        commands = [c for b in blocks if b.kind == kind for c in b.commands]
        if not commands:
            continue
        with tempfile.TemporaryDirectory(prefix="docs-check-") as tmp:
            env = Environment(kind, binary, redis_server, Path(tmp))
            try:
                started = time.monotonic()
                results = run_session(env, commands, binary, Path(tmp), timeout, root)
                elapsed = time.monotonic() - started
            finally:
                env.close()
            before = len(failures)
            for c, (output, status) in zip(commands, results):
                count += 1
                if output is None:
                    failures.append(f"{rel}:{c.line}: not run (an earlier command ended the session)")
                    continue
                actual = env.unsubstitute(output)
                if record and c.out_lines >= 0:
                    recorded.append((c, actual))
                    continue
                want, got = normalize(c.expected), normalize(actual)
                if want != got or not status.isdigit():
                    first = c.text.split("\n")[0]
                    diff = "\n".join(difflib.unified_diff(want, got, f"{rel}:{c.line} (the page)",
                                                          "(the service)", lineterm=""))
                    note = "" if status.isdigit() else f" [{status}]"
                    failures.append(f"{rel}:{c.line}: the output of `$ {first}` differs{note} (masked):\n{diff}")
            if len(failures) > before:
                log = env.log.read_text(errors="replace").splitlines()[-15:]
                failures.append(f"{rel}: the last lines of the service's log ({kind}):\n  " + "\n  ".join(log))
            print(f"  {rel} ({kind}): {len(commands)} commands in {elapsed:.1f} s", file=sys.stderr)
    if recorded:
        lines = path.read_text(encoding="utf-8").split("\n")
        for c, actual in sorted(recorded, key=lambda r: -r[0].line):
            first = c.line - 1 + c.cmd_lines
            new = actual[:-1].split("\n") if actual.endswith("\n") else actual.split("\n")
            lines[first : first + c.out_lines] = [] if actual == "" else new
        path.write_text("\n".join(lines), encoding="utf-8")
        print(f"  {rel}: wrote the real outputs of {len(recorded)} commands", file=sys.stderr)
    return count, failures


def _exit_on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # so that the finally blocks stop the processes


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    ap = argparse.ArgumentParser(description="Run the docs' runnable examples and check their links.")
    ap.add_argument("--binary", type=Path, help="the ratelimiter binary to run the examples against")
    ap.add_argument("--redis-server", default=None, help="redis-server to use (default: the one on PATH)")
    ap.add_argument("--no-run", action="store_true", help="only check links")
    ap.add_argument("--list-external", action="store_true", help="print the http(s) links (not fetched)")
    ap.add_argument("--record", action="store_true",
                    help="write the real outputs into the pages instead of comparing (review the diff!)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds one page's session may take")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this script's)")
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.files:
        run_files = link_files = [f.resolve() for f in args.files]
    else:
        run_files, link_files = default_files(root)
    failures: list[str] = []
    external: list[str] = []
    failures += check_links(link_files, root, external)
    commands = 0
    if not args.no_run:
        if args.binary is None:
            ap.error("--binary is required unless --no-run is given")
        binary = args.binary.resolve()
        if not os.access(binary, os.X_OK):
            ap.error(f"{binary} is not an executable (build it: cargo build --release)")
        for tool in ("bash", "curl"):
            if not shutil.which(tool):
                raise SystemExit(f"docs/check.py: {tool} is not on PATH (Debian: apt-get install -y {tool})")
        redis_server = args.redis_server or shutil.which("redis-server")
        for path in run_files:
            n, f = check_page(path, root, binary, redis_server, args.timeout, args.record)
            commands += n
            failures += f
    if args.list_external:
        print("External links (not fetched):")
        print("\n".join(external) if external else "  none")
    for f in failures:
        print(f"\n{f}")
    print(
        f"\ndocs/check.py: {len(link_files)} pages' links, {commands} commands run: "
        + (f"{len(failures)} failures" if failures else "all good"),
        file=sys.stderr,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
