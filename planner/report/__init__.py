"""The best-practice report (`planner report`): the seed documents' advice applied to one model
and cluster, with numbers and pictures.

    content = build.build_report(build.Scenario(model=..., hardware=..., gpus=...))
    render.write_report(content, out_dir)     # report.html, report.md, report.json, figures/

Modules: build (assembles sections from recommend/estimate), backend (the only calls into the rest
of the planner), checklist (one small function per rule), timeline (pipeline schedules as op
timelines), figures (matplotlib, Agg) and render (HTML with embedded PNGs, Markdown).
"""
