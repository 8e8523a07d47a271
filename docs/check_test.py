"""Tests of docs/check.py, the docs test.

    RATELIMITER_BINARY=target/release/ratelimiter python3 -m unittest docs/check_test.py

The end-to-end tests run the real binary (RATELIMITER_BINARY) and a real redis-server (from
PATH); without them they fail, saying how to get them.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check  # noqa: E402


class Masking(unittest.TestCase):
    def test_volatile_tokens_are_masked_and_the_rest_is_kept(self):
        line = (
            '{"allowed":true,"remaining":2,"reset_after_ms":11308,"retry_after_ms":0,'
            '"ticket":"2.1.6c7d8526599a5a4a.1.1796061480000000.1ded12fc0fd5ba8589d151535b538295",'
            '"created_at":"2026-12-01T10:00:00Z","id":"3f9b1e2d4a6870c1"}'
        )
        self.assertEqual(
            check.mask_line(line),
            '{"allowed":true,"remaining":2,"reset_after_ms":<ms>,"retry_after_ms":<ms>,'
            '"ticket":"2.1.<hex>.1.<hex>.<hex>","created_at":"<time>","id":"<hex>"}',
        )

    def test_headers(self):
        self.assertEqual(check.mask_line("date: Wed, 02 Dec 2026 04:27:19 GMT"), "date: <date>")
        self.assertEqual(check.mask_line("Retry-After: 12"), "Retry-After: <n>")
        self.assertEqual(check.mask_line("content-length: 165"), "content-length: <n>")
        self.assertEqual(check.mask_line('ratelimit: "login";r=0;t=12'), 'ratelimit: "login";r=0;t=<n>')
        self.assertEqual(check.mask_line('policy-etag: "c015328d1843db1b.2"'), 'policy-etag: "<hex>.2"')
        self.assertEqual(check.mask_line("epoch 1796061480123 ms"), "epoch <big> ms")

    def test_what_must_match_is_not_masked(self):
        for line in ['{"remaining":1,"limit":3}', "HTTP/1.1 429 Too Many Requests", "version 17", "w=60", "deadbeef"]:
            self.assertEqual(check.mask_line(line), line)

    def test_headers_are_compared_in_any_order_but_the_body_is_not(self):
        a = "HTTP/1.1 200 OK\nb: 2\na: 1\n\n{\"x\":1}\nsecond\nfirst\n"
        b = "HTTP/1.1 200 OK\na: 1\nb: 2\n\n{\"x\":1}\nsecond\nfirst"
        self.assertEqual(check.normalize(a), check.normalize(b))
        self.assertNotEqual(check.normalize(a), check.normalize(a.replace("second\nfirst", "first\nsecond")))


class Parsing(unittest.TestCase):
    PAGE = textwrap.dedent(
        """\
        # Page

        ```console
        $ not run
        ```

        <!-- runnable -->
        ```console
        $ echo a \\
            b
        a b
        $ true
        $ printf 'x\\ny\\n'
        x
        y
        ```

        <!-- runnable: redis -->
        ```sh
        X=1
        ```
        """
    )

    def test_blocks_commands_and_expected_outputs(self):
        blocks = check.runnable_blocks(Path("p.md"), self.PAGE)
        self.assertEqual([(b.kind, b.lang) for b in blocks], [("embedded", "console"), ("redis", "sh")])
        cmds = blocks[0].commands
        self.assertEqual([c.text for c in cmds], ["echo a \\\n    b", "true", "printf 'x\\ny\\n'"])
        self.assertEqual([c.expected for c in cmds], ["a b", "", "x\ny"])
        self.assertEqual([c.line for c in cmds], [9, 12, 13])

    def test_malformed_blocks_are_refused(self):
        for page in ["<!-- runnable -->\n```console\noutput first\n```\n",
                     "<!-- runnable -->\n```json\n{}\n```\n",
                     "<!-- runnable: redsi -->\n```console\n$ true\n```\n"]:
            with self.assertRaises(check.PageError):
                check.runnable_blocks(Path("p.md"), page)


class Links(unittest.TestCase):
    def test_slugs(self):
        self.assertEqual(check.github_slug("Envoy's rate-limit service (gRPC)"), "envoys-rate-limit-service-grpc")
        self.assertEqual(check.github_slug("Peek, report, refund, reset"), "peek-report-refund-reset")
        self.assertEqual(check.github_slug("`limits.shadow` and [leases](leases.md)"), "limitsshadow-and-leases")

    def test_dead_files_and_anchors_are_reported_and_code_is_ignored(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "docs").mkdir()
            (root / "src").mkdir()
            (root / "src" / "lib.rs").write_text("")
            (root / "docs" / "b.md").write_text("# B\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
            (root / "docs" / "a.md").write_text(
                textwrap.dedent(
                    """\
                    # A
                    [ok](b.md) [ok](b.md#same-1) [ok](../src/lib.rs) ![img](b.md) [self](#a) [root](/src/lib.rs)
                    [dead](c.md) [anchor](b.md#not-a-heading) [anchor2](b.md#same-2)
                    `[code](nothing.md)`
                    ```
                    [fenced](nothing.md)
                    ```
                    [ref]: missing.md
                    [ext](https://example.com/x)
                    """
                )
            )
            external: list[str] = []
            errors = check.check_links([root / "docs" / "a.md"], root, external)
        self.assertEqual(len(errors), 4, errors)
        self.assertTrue(errors[0].startswith("docs/a.md:3: dead link 'c.md'"), errors)
        self.assertIn("'b.md#not-a-heading'", errors[1])
        self.assertIn("'b.md#same-2'", errors[2])
        self.assertTrue(errors[3].startswith("docs/a.md:8: dead link 'missing.md'"), errors)
        self.assertEqual(external, ["docs/a.md:9: https://example.com/x"])


def binary() -> Path:
    value = os.environ.get("RATELIMITER_BINARY")
    if not value or not os.access(value, os.X_OK):
        raise AssertionError(
            "set RATELIMITER_BINARY to a built ratelimiter (cargo build --release; "
            "RATELIMITER_BINARY=target/release/ratelimiter)"
        )
    return Path(value)


class EndToEnd(unittest.TestCase):
    """Runs pages against the real binary: a matching one passes, a changed output fails."""

    PAGE = textwrap.dedent(
        """\
        # T

        <!-- runnable -->
        ```console
        $ RL=http://127.0.0.1:8080
        $ curl -s $RL/v1/policies -d '{"name": "t", "algorithm": "fixed_window", "limit": 1, "window_ms": 3600000}' -o /dev/null -w '%{http_code}\\n'
        201
        ```

        Variables and policies carry to the next block:

        <!-- runnable -->
        ```console
        $ for i in 1 2; do curl -s $RL/v1/acquire -d '{"policy": "t", "key": "k"}' | jq -c '[.allowed, .remaining]'; done
        [true,0]
        [false,0]
        $ ratelimiter --help | grep -c '^usage: ratelimiter '
        1
        ```
        """
    )
    REDIS_PAGE = textwrap.dedent(
        """\
        # R

        <!-- runnable: redis -->
        ```console
        $ curl -s http://127.0.0.1:8080/readyz | jq -r .store
        redis
        $ redis-cli -p 6379 ping
        PONG
        ```
        """
    )

    def run_page(self, text: str) -> tuple[int, str]:
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "page.md"
            page.write_text(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = check.main(["--binary", str(binary()), "--root", tmp, str(page)])
        return rc, out.getvalue()

    def test_a_matching_page_passes(self):
        self.assertTrue(shutil.which("jq"), "jq is needed (Debian: apt-get install -y jq)")
        rc, out = self.run_page(self.PAGE)
        self.assertEqual(rc, 0, out)
        self.assertIn("4 commands run: all good", out)

    def test_a_changed_output_fails_naming_the_line(self):
        rc, out = self.run_page(self.PAGE.replace("[false,0]", "[true,0]"))
        self.assertEqual(rc, 1, out)
        self.assertIn("page.md:14: the output of `$ for i in 1 2;", out)
        self.assertIn(" [true,0]\n-[true,0]\n+[false,0]\n", out)

    def test_a_command_that_kills_the_session_fails_the_rest(self):
        rc, out = self.run_page(self.PAGE.replace("$ ratelimiter --help | grep -c '^usage: ratelimiter '", "$ exit 3"))
        self.assertEqual(rc, 1, out)
        self.assertIn("the session ended here", out)

    def test_redis_pages_get_their_own_redis_server(self):
        self.assertTrue(shutil.which("redis-server"), "redis-server is needed (Debian: apt-get install -y redis-server)")
        rc, out = self.run_page(self.REDIS_PAGE)
        self.assertEqual(rc, 0, out)


if __name__ == "__main__":
    unittest.main()
