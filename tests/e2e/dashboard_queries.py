#!/usr/bin/env python3
"""Evaluates every query of every Grafana dashboard panel through Prometheus' HTTP API.

  dashboard_queries.py --prometheus http://127.0.0.1:9090 --var namespace=NS --var job='a|b' \
      [--timeout 120] [--expect-empty 'some_query'] charts/distrain/dashboards/*.json

Each panel target's `expr` (rows' nested panels too; hidden targets skipped), with the
dashboard's variables ($name, ${name}, [[name]]) replaced by the --var values as Grafana
would for a multi-value regex selection, is sent to /api/v1/query. A query "has data" when
it returns at least one sample with a finite value (histogram_quantile over buckets that
never moved gives NaN: Grafana draws nothing, so that counts as empty). The dashboard's
query variables (label_values(selector, label)) must have values too. Queries are retried
until every one has data or --timeout passes; then each empty one is printed with its
dashboard, panel title, refId and expression, and the exit status is 1.
--expect-empty QUERY: a query that must return nothing (the checker's own check that an
absent series is seen as absent); 1 if it has data.
"""
import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def panels_of(dashboard):
    def walk(panels):
        for p in panels or []:
            yield p
            yield from walk(p.get("panels"))
    yield from walk(dashboard.get("panels"))


def substitute(expr, variables):
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in variables:
            raise KeyError(name)
        return variables[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", repl, expr)


def queries_of(path, variables):
    """(where, expr) for every query the dashboard at `path` sends."""
    with open(path) as f:
        d = json.load(f)
    name = d.get("title", path)
    out = []
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q or "")
        if not m:
            m2 = re.fullmatch(r"\s*label_values\((\w+)\)\s*", q or "")
            if not m2:
                raise SystemExit(f"{name}: variable {v['name']}: cannot evaluate query {q!r}")
            out.append((f"{name} / variable ${v['name']}", f"count by ({m2.group(1)}) ({{{m2.group(1)}=~\".+\"}})"))
            continue
        sel = substitute(m.group(1), variables)
        out.append((f"{name} / variable ${v['name']}", f"count by ({m.group(2)}) ({sel})"))
    for p in panels_of(d):
        for t in p.get("targets", []) or []:
            if t.get("hide") or not t.get("expr"):
                continue
            try:
                expr = substitute(t["expr"], variables)
            except KeyError as e:
                raise SystemExit(f"{name}: panel {p.get('title')!r}: no --var for ${e.args[0]}")
            out.append((f"{name} / panel {p.get('title')!r} query {t.get('refId', '?')}", expr))
    return out


def query(prom, expr):
    """(samples with a finite value, error or None)."""
    url = prom.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return [], json.load(e).get("error", str(e))
        except Exception:
            return [], str(e)
    except Exception as e:  # connection refused, timeout
        return [], str(e)
    if body.get("status") != "success":
        return [], body.get("error", "status " + str(body.get("status")))
    res = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        res = [{"metric": {}, "value": res}]
    finite = []
    for s in res:
        values = [s["value"]] if "value" in s else s.get("values", [])
        if any(math.isfinite(float(v[1])) for v in values):
            finite.append(s)
    return finite, None


def describe(samples):
    s = samples[0]
    labels = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k != "__name__")
    return f"{len(samples)} series, e.g. {{{labels}}} = {s['value'][1]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--var", action="append", default=[], help="name=value")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--expect-empty", action="append", default=[])
    ap.add_argument("--no-data-expected", action="append", default=[],
                    help="'PANEL TITLE=why': a panel that cannot have data in this cluster (e.g. "
                         "it needs GPUs); its queries must still parse")
    ap.add_argument("dashboards", nargs="+")
    a = ap.parse_args()
    variables = dict(v.split("=", 1) for v in a.var)
    todo = []
    for path in a.dashboards:
        todo += queries_of(path, variables)
    if not todo:
        sys.exit("no queries found in " + " ".join(a.dashboards))

    for expr in a.expect_empty:
        samples, err = query(a.prometheus, expr)
        if err or samples:
            print(f"FAIL: the checker's control query {expr!r} should be empty; got "
                  f"{err or describe(samples)}")
            return 1
        print(f"ok: control query {expr} returns nothing, as it must")

    exempt = dict(x.split("=", 1) for x in a.no_data_expected)
    checked = []
    for where, expr in todo:
        title = next((t for t in exempt if f"panel '{t}'" in where), None)
        if title is None:
            checked.append((where, expr))
            continue
        _, err = query(a.prometheus, expr)
        if err:
            print(f"FAIL: {where} does not evaluate: {err}: {expr}")
            return 1
        print(f"ok: {where}: evaluates; no data expected here ({exempt[title]})")
    todo = checked

    t0 = time.time()
    results = {}
    pending = list(todo)
    while True:
        still = []
        for where, expr in pending:
            samples, err = query(a.prometheus, expr)
            if samples:
                results[where] = describe(samples)
                print(f"ok: {where}: {results[where]} (after {time.time() - t0:.0f} s)")
            else:
                still.append((where, expr, err))
        pending = [(w, e) for w, e, _ in still]
        if not pending or time.time() - t0 > a.timeout:
            break
        time.sleep(2)
    for where, expr, err in still:
        print(f"FAIL: {where} returned no data within {a.timeout:.0f} s"
              f"{' (' + err + ')' if err else ''}: {expr}")
    print(f"{len(todo) - len(still)} of {len(todo)} queries have data")
    return 1 if still else 0


if __name__ == "__main__":
    sys.exit(main())
