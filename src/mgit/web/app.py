"""`mgit serve`'s web app: a Starlette application over one repository, read-only.

Every page is a function from the request's query to a dict (`models.py`, `diffs.py`,
`matrix.py`, `storage.py`); the same dict renders the page's Jinja2 template (autoescaped)
and is the JSON of its twin under /api. Handlers are synchronous (Starlette runs them on its
thread pool), as the library is. Assets come from the package (`static/`); nothing is
fetched from anywhere else, so the pages work offline. `access.py` decides who may look.

Routes (each also under /api, as JSON):
    /models                    searchable, sortable, filtered list
    /models/NAME[?version=N]   one model: versions, lineage, card, files, tensors, tests
    /diff?a=REF&b=REF          two versions compared (computed in the background)
    /tests                     models x tests; /tests/result?version=ID&test=NAME
    /storage                   what each model costs and why
    /lineage[?around=NAME]     the lineage graph page (its JSON: `mgit graph --json`)
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from mgit.errors import DiffsBusyError, MgitError, NoMatchError, NoPathError, UnknownRefError
from mgit.lineage.graph import LineageGraph
from mgit.repo.repository import Repo
from mgit.reports import VersionStorage, human_size, json_safe
from mgit.web.access import Guard, check_setup
from mgit.web.diffs import DiffJobs, heatmap, resolve_pair
from mgit.web.graph import graph_json, page_csp, render_html
from mgit.web.matrix import matrix_page, result_page
from mgit.web.models import model_page, models_page
from mgit.web.params import text
from mgit.web.repoview import RepoView
from mgit.web.storage import storage_page

Builder = Callable[[Request], dict[str, Any]]
NAV = (("Models", "/models"), ("Tests", "/tests"), ("Storage", "/storage"), ("Lineage", "/lineage"), ("Diff", "/diff"))


def create_app(
    repo: Repo, *, host: str = "127.0.0.1", token: str | None = None, refresh: Callable[[], object] | None = None
) -> Guard:
    """The app serving `repo` (a mirror: with the `refresh` that brings it up to date);
    refuses (TokenRequiredError) to serve a non-loopback `host` without a `token`."""
    check_setup(host, token)
    view, jobs = RepoView(repo, refresh=refresh), DiffJobs(repo)
    templates = Jinja2Templates(env=environment())
    title = repo.root.name

    def page(template: str, build: Builder) -> tuple[Callable[[Request], Response], Callable[[Request], Response]]:
        def html(request: Request) -> Response:
            data = build(request)
            status = data.pop("_status", 200)
            return templates.TemplateResponse(
                request, template, {"data": data, "nav": NAV, "repo": title}, status_code=status
            )

        def api(request: Request) -> Response:
            data = build(request)
            status = data.pop("_status", 200)
            return JSONResponse(json_safe(data), status_code=status)

        return html, api

    def diff(request: Request) -> dict[str, Any]:
        a, b = text(request.query_params, "a").strip(), text(request.query_params, "b").strip()
        if not a and not b:
            return {"a": "", "b": "", "state": "form", "models": sorted(view.lineage.nodes)[:2000]}
        va, vb = resolve_pair(repo, a, b)
        job = jobs.job(va, vb)
        data: dict[str, Any] = {"a": a, "b": b, **job.progress()}
        if job.state == "done" and job.result is not None:
            data.update(result=job.result.to_json(), heatmap=heatmap(job.result))
        elif job.state != "error":
            data["_status"] = 202
        return data

    def lineage_of(request: Request) -> tuple[str | None, LineageGraph, dict[str, VersionStorage]]:
        """The graph (all of it, or `?around=NAME`'s family) and its versions' storage, kept
        for the page and its JSON twin alike."""
        around = text(request.query_params, "around").strip() or None

        def make() -> tuple[LineageGraph, dict[str, VersionStorage]]:
            graph = view.lineage.subgraph(view.lineage.selection(around=around))
            return graph, repo.storage([v.id for vs in graph.versions.values() for v in vs])

        return around, *view.kept(("lineage-graph", around), make)

    def lineage_page(request: Request) -> Response:
        around, graph, storage = lineage_of(request)

        def make() -> str:
            links = [(label, href) for label, href in NAV if href != "/lineage"]
            if around:
                links.insert(0, (f"back to {around}", f"/models/{quote(around)}"))
            return render_html(
                graph,
                title=f"MGit lineage: {title}" + (f" around {around}" if around else ""),
                storage=storage,
                selected=around,
                links=links,
                model_pages="/models/",
                outside=view.lineage.edges_leaving(n.name for n in graph.nodes),
            )

        return Response(view.kept(("lineage-page", around), make), media_type="text/html")

    def lineage_api(request: Request) -> Response:
        around, graph, storage = lineage_of(request)
        body = view.kept(("lineage-json", around), lambda: JSONResponse(graph_json(graph, storage=storage)).body)
        return Response(body, media_type="application/json")

    pages = {
        "/models": ("models.html", lambda r: models_page(view, r.query_params)),
        "/models/{name:path}": ("model.html", lambda r: model_page(view, r.path_params["name"], r.query_params)),
        "/diff": ("diff.html", diff),
        "/tests": ("tests.html", lambda r: matrix_page(view, r.query_params)),
        "/tests/result": ("result.html", lambda r: result_page(view, r.query_params)),
        "/storage": ("storage.html", lambda r: storage_page(view, r.query_params)),
    }
    routes: list[Any] = [Route("/", lambda r: RedirectResponse("/models", status_code=303))]
    for path, (template, build) in pages.items():
        html, api = page(template, build)
        routes += [Route(path, html), Route(f"/api{path}", api)]
    routes += [
        Route("/lineage", lineage_page),
        Route("/api/lineage", lineage_api),
        Mount("/static", StaticFiles(packages=[("mgit.web", "static")]), name="static"),
    ]

    def failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status, message, hint = exc.status_code, exc.detail, None
        else:
            assert isinstance(exc, MgitError)
            status = (
                404
                if isinstance(exc, (UnknownRefError, NoMatchError, NoPathError))
                else 503
                if isinstance(exc, DiffsBusyError)
                else 400
            )
            message, hint = exc.message, exc.hint
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message, "hint": hint}, status_code=status)
        return templates.TemplateResponse(
            request,
            "error.html",
            {"data": {"status": status, "error": message, "hint": hint}, "nav": NAV, "repo": title},
            status_code=status,
        )

    app = Starlette(routes=routes, exception_handlers={MgitError: failed, HTTPException: failed})
    return Guard(app, token=token, csp=lambda path: page_csp() if path == "/lineage" else None)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_template), autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(
        size=lambda n: "-" if n is None else human_size(n),
        short=lambda s: (s or "-")[:12],
        when=lambda t: (t or "")[:16].replace("T", " "),
        g=_g,
        pct=_pct,
        path=lambda s: quote(s),
        shape=lambda s: "-" if s is None else "x".join(map(str, s)) or "scalar",
    )
    env.globals.update(link=_link)
    return env


def _template(name: str) -> str:
    return resources.files("mgit.web").joinpath("templates", name).read_text(encoding="utf-8")


def _link(path: str, query: dict[str, Any], **changes: Any) -> str:
    """`path?query` with some parameters changed (None or "" drops one)."""
    merged = {k: v for k, v in {**query, **changes}.items() if v not in (None, "")}
    return path + (f"?{urlencode(merged)}" if merged else "")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _pct(part: float | None, whole: float | None) -> str:
    return "-" if not whole or part is None else f"{100 * part / whole:.1f}%"
