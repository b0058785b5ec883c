"""`lorarl-serve @ cfg.toml`: the Tinker API on one base model for many tenants (docs/serve.md).

Every check runs before anything is cleared or started (`--dry-run` makes the same checks and prints
the placement and memory plan); then the vLLM workers and the trainer start, and the API answers
until Ctrl-C. `--resume` continues the server of the run folder.
"""

from __future__ import annotations

import logging

from lorarl.cli.common import also_log_to, ctrl_c_in_one_line, exit_with, load_run_or_exit, setup_logging
from lorarl.config.serve import ServeConfig, ServeRunMode
from lorarl.exit_codes import BAD_INPUT
from lorarl.launcher.memory_plan import serve_memory_plan
from lorarl.launcher.preflight import PreflightError, check_serve
from lorarl.run_folder import RunFolderError
from lorarl.serve.folder import ServeFolder
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.serve")


@ctrl_c_in_one_line("lorarl-serve")
def main(argv: list[str] | None = None) -> None:
    cfg, mode = load_run_or_exit(ServeConfig, ServeRunMode, argv)
    setup_logging("serve")
    folder = ServeFolder(cfg.run_dir)
    try:
        placement = check_serve(cfg, mode)
        if mode.resume and not folder.database.is_file():
            raise RunFolderError(f"--resume: {folder.root} holds no lorarl-serve state ({folder.database.name})")
        done = folder.prepare("serve", cfg.model_dump(mode="json"), mode.resume, mode.overwrite, mode.dry_run)
    except (PreflightError, RunFolderError) as e:
        exit_with(e, BAD_INPUT)
    log.info(done)
    from lorarl.launcher.serve import plan_serve, serve  # aiohttp, the SDK's protobuf: once the config is valid

    specs = plan_serve(cfg, folder, placement)
    memory = serve_memory_plan(cfg, placement, mode.device_memory_gib).table()
    (folder.configs / "memory_plan.txt").write_text(memory)
    record_written(folder.configs / "memory_plan.txt")
    if mode.dry_run:
        print(placement.table())
        print(memory)
        print((folder.configs / "commands.txt").read_text(), end="")
        print(f"# configs, placement.txt and memory_plan.txt in {folder.configs}/ (dry run: nothing started)")
        return
    folder.hold_lock()
    also_log_to(folder.logs / "serve.log", "serve")  # what placement.txt names, and a server error points to
    if cfg.model.quantization != "none" and not cfg.inference.urls:
        from lorarl.quantized_base import ensure_served_base  # torch, bitsandbytes: only for a quantized base

        log.info("vLLM serves %s", ensure_served_base(cfg.model, folder.root))
    raise SystemExit(serve(cfg, mode.resume, folder, specs, placement))


if __name__ == "__main__":
    main()
