"""The viewer's HTTP side: a JSON API over ``RunFiles`` and the page's static files (no build step, nothing from a
CDN: the machines this runs on are often offline)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from rlinf_search.viewer.run_files import RunFiles

STATIC = Path(__file__).resolve().parent / "static"


def viewer_app(run_dir: Path) -> FastAPI:
    files = RunFiles(run_dir)
    app = FastAPI(title=f"rlinf-search view {run_dir}", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def missing(what: str) -> JSONResponse:
        return JSONResponse({"error": what}, status_code=404)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/run")
    def run() -> dict:
        dumps = files.dumps()
        return {"run": str(run_dir), "dumps": [{"name": d.name, "step": d.step, "kind": d.kind} for d in dumps],
                "firings": files.firings(), "metrics": sorted(files.metrics())}

    @app.get("/api/rollouts/{name}")
    def rollouts(name: str):
        dump = files.dump(name)
        if dump is None:
            return missing(f"no rollout file {name} in {run_dir / 'rollouts'} (runner.rollout_dump writes them)")
        return {"name": name, "step": dump.step, "kind": dump.kind, "rows": files.rows(dump)}

    @app.get("/api/prompt/{uid}")
    def prompt(uid: str):
        rows = files.prompt(uid)
        return {"uid": uid, "rows": rows} if rows else missing(f"no dumped trajectory of prompt {uid}")

    @app.get("/api/metrics")
    def metrics() -> dict:
        return {"series": files.metrics(), "firings": files.firings()}

    return app
