#!/usr/bin/env python3
"""sync.py's embeddings, read back by a real YAML parser (PyYAML, from check.sh's virtualenv).

    target/k8s-venv/bin/python deploy/kubernetes/test_sync.py

sync.py writes YAML as text, without a YAML library; these cases hold the texts whose meaning an
indentation or a chomping mistake would change, and the sources it must refuse.
"""

import json
import pathlib
import sys
import unittest

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sync  # noqa: E402

RULES = """\
# a comment at the top
groups:  # a comment after the key
  - name: g
    rules:
      - alert: A
        expr: |
          sum(rate(x[5m]))
            > 1

          # not a comment: part of the expression's text
        annotations:
          literal_kept: |+
            two lines end here


          folded: >-
            folded
            text
          spaces_only_line: |
            a

            b
          explicit: |2
               indented three beyond the key
          quoted: "{{ $labels.instance }}: it's \\"down\\""
      - record: r
        expr: vector(1)
"""


class PrometheusRule(unittest.TestCase):
    def test_the_spec_is_the_rules_file(self):
        rule = yaml.safe_load(sync.prometheus_rule(RULES))
        self.assertEqual(rule["spec"], yaml.safe_load(RULES))
        self.assertEqual(rule["kind"], "PrometheusRule")

    def test_a_rules_file_without_a_final_line_end(self):
        text = RULES.rstrip("\n")
        self.assertEqual(yaml.safe_load(sync.prometheus_rule(text))["spec"], yaml.safe_load(text))

    def test_sources_that_cannot_be_indented_safely_are_refused(self):
        for text in (
            "groups: []\n",                              # flow style on the key's line
            "---\ngroups:\n  - name: g\n    rules: []\n",  # a document marker
            "groups:\n  - name: g\n    rules: []\nother: 1\n",  # a second top-level key
            "groups:\n\t- name: g\n",                    # a tab
            "groups:\r\n  - name: g\r\n",                # carriage returns
            "# no groups at all\n",
        ):
            with self.subTest(text=text), self.assertRaises(sync.SourceError):
                sync.prometheus_rule(text)


class DashboardConfigMap(unittest.TestCase):
    def round_trip(self, text):
        config_map = yaml.safe_load(sync.dashboard_config_map(text))
        self.assertEqual(config_map["metadata"]["labels"]["grafana_dashboard"], "1")
        return config_map["data"]["ratelimiter.json"]

    def test_the_data_is_the_file_byte_for_byte(self):
        body = json.dumps({"title": "t", "panels": [{"expr": "a\tb", "legend": "{{x}} é ☃ 𝄞"}]}, indent=2,
                          ensure_ascii=False)
        for text in (body, body + "\n", body + "\n\n\n", body.replace('"t"', '"t"   ') + "\n",
                     body.replace("\n", "\n\n") + "\n", '{"a": 1}', "{\n      \n}\n"):
            with self.subTest(text=text[-20:]):
                self.assertEqual(self.round_trip(text), text)

    def test_sources_that_cannot_stand_in_a_literal_block_are_refused(self):
        for text in ("", "not json", '  {"a": 1}', '{"a": 1}\r\n', '{"a": "\x7f"}', '{"a": "\x9f"}'):
            with self.subTest(text=text), self.assertRaises(sync.SourceError):
                sync.dashboard_config_map(text)


class ImageTag(unittest.TestCase):
    def test_the_tag_follows_cargo_toml(self):
        version = sync.tomllib.loads(sync.CARGO.read_text())["package"]["version"]
        text = sync.deployment_with_version("spec:\n  image: ratelimiter:0.0.0-old\n")
        self.assertEqual(text, f"spec:\n  image: ratelimiter:{version}\n")


if __name__ == "__main__":
    unittest.main(verbosity=1)
