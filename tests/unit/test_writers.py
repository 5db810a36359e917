"""Every place the package writes a file or a folder, or hands a path to a library that
writes (issue 59, section 2): a walk over workload/'s syntax finds each call that creates,
writes, renames or makes something by path, outside workload/files.py and workload/held.py
(the home of the safe writes: a private temporary renamed into place, O_EXCL|O_NOFOLLOW;
folders held through a descriptor). Each one found must be in WRITERS with why it keeps
the rule; a new writer fails here until it uses those helpers or says why it needs none,
and an entry whose writer is gone fails too."""

from __future__ import annotations

import ast

from tests.helpers import REPO

SAFE_MODULES = ("workload.files", "workload.held")
# Calls named module.function that write by path.
MODULE_CALLS = {("os", "rename"), ("os", "replace"), ("os", "mkdir"), ("os", "makedirs"),
                ("os", "symlink"), ("os", "link"), ("shutil", "copy"), ("shutil", "copy2"),
                ("shutil", "copyfile"), ("shutil", "copytree"), ("shutil", "move"),
                ("tempfile", "mkstemp"), ("tempfile", "mkdtemp"),
                ("tempfile", "NamedTemporaryFile"), ("tempfile", "TemporaryDirectory"),
                ("tempfile", "TemporaryFile"),
                ("torch", "save"), ("wandb", "init"), ("np", "save")}
# Methods that write by path (Path's, tarfile's, matplotlib's).
METHODS = {"write_text", "write_bytes", "mkdir", "touch", "symlink_to", "hardlink_to",
           "extract", "extractall", "savefig"}
# Library writers handed a path.
FUNCTIONS = {"save_file", "serialize_file", "SummaryWriter", "save_image"}
WRITE_FLAGS = ("O_CREAT", "O_WRONLY", "O_RDWR", "O_APPEND", "O_TRUNC")

# (module, function, call) -> why it keeps the rule.
WRITERS = {
    ("workload.bench.common", "write_report", ".mkdir"):
        "the parent of the --json file the user named; the file itself: files.write_json",
    ("workload.bench.commit", "run", "tempfile.mkdtemp"):
        "a private (0700) folder of a name no one can foresee, in --dir",
    ("workload.bench.commit", "measure", ".mkdir"):
        "inside that private temporary folder",
    ("workload.bench.commit", "timed_write", "open"):
        "a new file (mode x: O_EXCL) inside that private temporary folder",
    ("workload.errors", "_refuses_writes", "os.open"):
        "an unnamed file (O_TMPFILE): nothing at any name, gone as it is closed",
    ("workload.bench.first_step", "measure", "tempfile.TemporaryDirectory"):
        "a private (0700) folder of a name no one can foresee",
    ("workload.bench.first_step", "measure", ".mkdir"):
        "inside that private temporary folder",
    ("workload.caches", "private_root", "tempfile.mkdtemp"):
        "a private (0700) folder of a name no one can foresee",
    ("workload.checkpoint.background", "_reserved_file", "os.open"):
        "O_CREAT|O_EXCL, mode 0600, a random name in /dev/shm (sticky: no one else can "
        "rename or replace it)",
    ("workload.checkpoint.background", "fit", "os.open"):
        "reopens that file of its own in the sticky /dev/shm, then unlinks it",
    ("workload.checkpoint.writer.folder", "_rename_into_place", "os.replace"):
        "renames an older save of the step aside inside checkpoints/: a rename never "
        "follows a link at its names, and writes no file",
    ("workload.checkpoint.writer.folder", "move_aside", "os.replace"):
        "renames a bad or unfinished save aside inside checkpoints/ (as above)",
    ("workload.checkpoint.inprocess", "make_save_folder", ".mkdir"):
        "the run's checkpoints/ (exist_ok), in train through its held run folder "
        "(RunFolder.hold); the save's own folder: held.make_held, and shards/ inside it "
        "(the other FSDP ranks write there through their own descriptor of that folder, "
        "found by its inode: held.hold_by_inode)",
    ("workload.checkpoint.writer.store", "copy_to_run", ".mkdir"):
        "the run's checkpoints/ (exist_ok), through train's held run folder; the copy's "
        "own folder: held.make_held",
    ("workload.checkpoint.writer.store", "_copy_durably", ".mkdir"):
        "inside the copy's held private folder (its files: files.create_new)",
    ("workload.checkpoint.local", "bind_to_run", ".mkdir"):
        "the run's checkpoints/ (exist_ok) through the held run folder; the id files: "
        "files.replace_file through checkpoints/ held (held.holding) and the tier's "
        "folder held (held.hold_folder: the user's own, private)",
    ("workload.checkpoint.lock", "_break", "os.link"):
        "the lock's protocol: link(2) of a private draft fails on any name in the way",
    ("workload.checkpoint.lock", "_break", "os.replace"):
        "renames a stale lock aside; writes no file",
    ("workload.checkpoint.lock", "_link", "os.link"):
        "the lock's protocol (link(2) never follows or replaces)",
    ("workload.checkpoint.lock", "_draft", "tempfile.mkstemp"):
        "O_EXCL, mode 0600, a name no one can foresee",
    ("workload.checkpoint.lock", "_fs_now", "tempfile.NamedTemporaryFile"):
        "O_EXCL, a name no one can foresee, removed at once (reads the file system's clock)",
    ("workload.checkpoint.writer.process", "_write_tensors", "serialize_file"):
        "a path inside the save's held private folder (/proc/PID/fd/N/...)",
    ("workload.checkpoint.writer.process", "open", "os.open"):
        "maps the loop's staging buffer through /proc/PID/fd: creates nothing",
    ("workload.data.stagefiles", "_open_lock_file", "os.open"):
        "O_NOFOLLOW, checked a regular file on its descriptor, in the user's own staging "
        "folder (staging.own_folder)",
    ("workload.data.stagefiles", "copy_folder", ".mkdir"):
        "inside the private partial copy (mkdtemp) in the user's own staging folder",
    ("workload.data.stagefiles", "unpack_tar", ".mkdir"):
        "inside the private partial copy, names checked relative (safe_name); its files "
        "through files.create_new",
    ("workload.distributed", "_held_stderr", "tempfile.TemporaryFile"):
        "a private file with no name (unlinked at once), stderr while the group forms",
    ("workload.launch.nccl_net", "nccl_log_for_one_run", "tempfile.TemporaryFile"):
        "a private file with no name (unlinked at once), NCCL's own log through "
        "/proc/PID/fd/N",
    ("workload.data.staging", "_stage_anew", "tempfile.mkdtemp"):
        "the private partial copy, a name no one can foresee, in the user's own folder",
    ("workload.data.staging", "_stage_anew", "os.rename"):
        "the partial copy into place, inside a folder only the user may write "
        "(staging.own_folder refuses any other)",
    ("workload.data.staging", "own_folder", "tempfile.mkdtemp"):
        "a private (0700) folder of a name no one can foresee, in a sticky folder",
    ("workload.launch.__main__", "flight_recorder_lines", ".mkdir"):
        "./diagnostics of the working folder of the user's own script (exist_ok); setup() "
        "in the script's process takes the printed prefix back for the held folder "
        "(diagnostics.held_for_the_process); a script that never calls setup() has torch "
        "write there by the name (docs/checkpoints.md says so)",
    ("workload.launch.diagnostics", "hold_diagnostics", ".mkdir"):
        "the folder's parent, made when missing; the folder: held.hold_own_folder "
        "(O_NOFOLLOW, the user's own, closed to others' writes), a link at a dump's name "
        "removed",
    ("workload.launch.jobs", "copy_jobs", ".mkdir"):
        "the DEST folder the user names; its files: files.replace_file",
    ("workload.records", "__init__", "SummaryWriter"):
        "the held path of the user's own private folder (records.board_folder)",
    ("workload.records", "__init__", "wandb.init"):
        "the held path of the user's own private folder (records.board_folder)",
    ("workload.report", "_save", ".savefig"):
        "into the file object of files.replacing (a private temporary renamed into place)",
    ("workload.training.compile_cache", "unpack", ".mkdir"):
        "inside the user's private Inductor cache (workload.caches), files through "
        "files.replacing",
}


def write_kind(node: ast.Call) -> str | None:
    """What a call writes by path, as `module.name`, `.method` or `name`; None if nothing."""
    func = node.func
    if isinstance(func, ast.Name):
        if func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            writes = not isinstance(mode, ast.Constant) or set("wax+") & set(str(mode.value))
            return "open" if mode is not None and writes else None
        return func.id if func.id in FUNCTIONS else None
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, ast.Name) and (func.value.id, func.attr) in MODULE_CALLS:
        return f"{func.value.id}.{func.attr}"
    if isinstance(func.value, ast.Name) and (func.value.id, func.attr) == ("os", "open"):
        return "os.open" if any(flag in ast.unparse(node) for flag in WRITE_FLAGS) else None
    if func.attr in METHODS:
        return f".{func.attr}"
    # Path.rename/replace take one path (str.replace two, dataclasses' keywords).
    if (func.attr in ("rename", "replace") and len(node.args) == 1 and not node.keywords
            and not isinstance(node.args[0], ast.Constant)):
        return f".{func.attr}"
    return None


def writers() -> set[tuple[str, str, str]]:
    found = set()
    for path in sorted((REPO / "workload").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module in SAFE_MODULES:
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and (kind := write_kind(node)):
                        found.add((module, function.name, kind))
    return found


def test_every_writer_of_the_package_keeps_the_rule_or_says_why():
    found = writers()
    assert sorted(found - set(WRITERS)) == [], (
        "a new writer by path: use workload.files (replace_file, create_new, open_append) "
        "or workload.held (make_held, hold_own_folder), or add it to WRITERS with why")
    assert sorted(set(WRITERS) - found) == [], "an entry whose writer is gone"


def test_the_walk_finds_the_writes_it_looks_for():
    """The walk itself: each kind of call it must see, and the look-alikes it must not."""
    source = '''
def f(p, cfg, text):
    open(p, "w"); open(p, mode="ab"); open(p); open(p, "rb")
    shutil.copyfile(p, q); os.rename(p, q); p.write_text("x"); p.mkdir()
    os.open(p, os.O_WRONLY | os.O_CREAT); os.open(p, os.O_RDONLY)
    p.replace(q); text.replace("a", "b"); cfg.replace(model="x")
    serialize_file({}, p); fig.savefig(p)
'''
    kinds = [write_kind(node) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call)]
    assert sorted(k for k in kinds if k) == sorted(
        ["open", "open", "shutil.copyfile", "os.rename", ".write_text", ".mkdir", "os.open",
         ".replace", "serialize_file", ".savefig"])
