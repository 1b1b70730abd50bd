"""A warm Python for the test suite: the Python peers' imports paid once, not once a call.

The tests start the project venv's Python about a hundred times (the peers of tests/models,
tests/data, tests/trainer, the example checks). Each start imported torch and transformers
again, 7-15 s on a 2-core machine, most of the suite's Python time. This file is both sides of
a fork server that removes that cost without changing what a script sees:

  server  imports torch, transformers, peft, accelerate, tokenizers, safetensors and numpy once,
          then, for each request, forks a child that takes the caller's argv, working folder,
          environment and standard streams (passed as file descriptors) and runs the script as
          `python script args...` would (runpy, __name__ == "__main__"), in a session of its
          own. The server reports the child's wait status; it exits after IDLE_S seconds with
          nothing to do.
  client  the program the tests call instead of Python (build/tests/warm_python, written by
          tests/CMakeLists.txt with the real interpreter's path): it connects to the server of
          its build folder (an abstract Unix socket named after the build folder and the
          interpreter), starting one when there is none, sends the call, and exits with the
          script's status. Whatever it cannot hand over (interpreter options, no script, a
          server that does not answer, LOOM_WARM_PYTHON=0) it runs on the real interpreter by
          exec, so a call never fails for being warm.

What a forked script shares with the server is only what it imported before the fork
(third-party packages, none of the project's files, no torch state: the server runs no
tensor operation). The environment a package read when it was imported is the server's:
the server starts with HF_HUB_OFFLINE=1 (no test uses the Hub) and without OMP_NUM_THREADS,
and each child sets torch's thread count from its own OMP_NUM_THREADS. The client's stop
command (`warm_python --warm-python-stop`) ends the server; `make test` calls it after ctest.

The client runs under `python -I -S` (no site, nothing imported but the standard library),
so it starts in about 20 ms.
"""

import json
import os
import socket
import struct
import sys

IDLE_S = float(os.environ.get("LOOM_WARM_PYTHON_IDLE_S", "120"))
PRELOAD = ["numpy", "torch", "torch.nn", "torch.nn.functional", "safetensors", "safetensors.torch", "tokenizers",
           "transformers", "accelerate", "peft"]
# transformers imports its submodules lazily: the names the peers use, resolved in the server.
PRELOAD_TRANSFORMERS = ["Trainer", "TrainingArguments", "HfArgumentParser", "AutoTokenizer",
                        "PreTrainedTokenizerFast", "GPT2LMHeadModel", "GPT2Config", "BertConfig",
                        "BertForSequenceClassification", "BertForMaskedLM", "LlamaConfig", "LlamaForCausalLM",
                        "AutoModelForCausalLM", "AutoModelForSequenceClassification", "get_scheduler"]


def _address(key):
    return "\0loom-warm-python-" + key


def _send_msg(sock, payload, fds=()):
    data = json.dumps(payload).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], list(fds))
    else:
        sock.sendall(header + data)


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# ---- client -------------------------------------------------------------------------------

def _supported(args):
    """args (after the interpreter) a fork can run: a script path, -c CODE or -m MODULE."""
    if not args:
        return False
    if args[0] in ("-c", "-m"):
        return len(args) >= 2
    return not args[0].startswith("-")


def _exec_real(real, args):
    os.execv(real, [real] + args)


def client(real, server_script, key, args):
    # A server runs the code of this file as it was when it started: an edit starts another.
    key += "-" + str(os.stat(server_script).st_mtime_ns)
    if args == ["--warm-python-stop"]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(_address(key))
                _send_msg(s, {"stop": True})
                _recv_exact(s, 1)
        except OSError:
            pass
        return 0
    if os.environ.get("LOOM_WARM_PYTHON") == "0" or not _supported(args):
        _exec_real(real, args)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(_address(key))
    except OSError:
        _start_server(real, server_script, key)
        import time
        deadline = time.monotonic() + 10
        while True:
            try:
                sock.connect(_address(key))
                break
            except OSError:
                if time.monotonic() > deadline:
                    _exec_real(real, args)
                time.sleep(0.02)
    try:
        # A script that starts Python itself can start it warm too (the test checks read
        # LOOM_WARM_PYTHON_CLIENT before sys.executable).
        env = dict(os.environ, LOOM_WARM_PYTHON_CLIENT=os.path.abspath(sys.argv[0]))
        _send_msg(sock, {"argv": args, "cwd": os.getcwd(), "env": env}, fds=(0, 1, 2))
        accepted = _recv_exact(sock, 1)
    except OSError:
        accepted = None
    if accepted != b"A":
        # The server went away before the script started (its imports failed, it was stopped):
        # nothing has run, so the real interpreter runs it.
        sock.close()
        _exec_real(real, args)
    reply = _recv_exact(sock, 5)
    if reply is None:
        sys.stderr.write("warm_python: the server ended during the run\n")
        return 1
    kind, value = reply[:1], struct.unpack("!i", reply[1:])[0]
    if kind == b"S":  # killed by a signal: end the same way, so that the caller sees it
        import signal
        if value not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        return 128 + value
    return value


def _start_server(real, server_script, key):
    """The server, detached: its own session, its output in LOOM_WARM_PYTHON_LOG (or nowhere)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    log = os.environ.get("LOOM_WARM_PYTHON_LOG", os.devnull)
    if os.fork() == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.closerange(3, 1024)
            os.chdir("/")
            os.execve(real, [real, server_script, "--warm-python-server", key], env)
        finally:
            os._exit(1)
    os.wait()


# ---- server -------------------------------------------------------------------------------

def server(key):
    import importlib
    import selectors
    import signal
    import time

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address(key))
    except OSError:
        return 0  # another server of this build folder won the start
    listener.listen(64)  # callers wait in the backlog while the imports run
    started = time.monotonic()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as e:  # a missing peer package: its scripts import it (and fail) themselves
            print(f"warm_python: {name} not preloaded: {e}", flush=True)
    try:
        import transformers
        for name in PRELOAD_TRANSFORMERS:
            getattr(transformers, name)
    except Exception as e:
        print(f"warm_python: transformers names not preloaded: {e}", flush=True)
    print(f"warm_python: ready after {time.monotonic() - started:.1f} s (pid {os.getpid()})", flush=True)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    runs = {}  # pid -> client connection
    last = time.monotonic()
    stopping = False
    while True:
        for key_, _ in sel.select(timeout=1.0):
            what = key_.data
            if what == "accept":
                conn, _ = listener.accept()
                pid = _take_request(conn, listener, wake_r, wake_w, runs)
                if pid == "stop":
                    stopping = True
                elif pid is not None:
                    runs[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, ("client", pid))
                last = time.monotonic()
            elif what == "wake":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            else:  # the client closed its end: the caller was killed, so is its script
                pid = what[1]
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                sel.unregister(key_.fileobj)
        while runs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = runs.pop(pid, None)
            if conn is None:
                continue
            try:
                sel.unregister(conn)
            except KeyError:
                pass
            if os.WIFSIGNALED(status):
                reply = b"S" + struct.pack("!i", os.WTERMSIG(status))
            else:
                reply = b"X" + struct.pack("!i", os.waitstatus_to_exitcode(status))
            try:
                conn.sendall(reply)
            except OSError:
                pass
            conn.close()
            last = time.monotonic()
        if not runs and (stopping or time.monotonic() - last > IDLE_S):
            return 0


def _take_request(conn, listener, wake_r, wake_w, runs):
    """Reads one request and forks its run; the child's pid, "stop", or None."""
    try:
        conn.settimeout(10)
        header, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if 0 < len(header) < 4:  # a short read: the rest of the length follows
            header += _recv_exact(conn, 4 - len(header)) or b""
        if len(header) < 4:
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        size = struct.unpack("!I", header)[0]
        request = json.loads(_recv_exact(conn, size))
        conn.settimeout(None)
    except (OSError, ValueError, TypeError):
        conn.close()
        return None
    if request.get("stop"):
        conn.sendall(b"A")
        conn.close()
        return "stop"
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            listener.close()
            os.close(wake_r)
            os.close(wake_w)
            for other in runs.values():
                other.close()
            conn.close()
            code = _run(request, fds)
        except BaseException:  # noqa: the child must never return into the server's loop
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(b"A")
    except OSError:
        pass
    return pid


def _run(request, fds):
    """In the forked child: become `python argv...` of the caller and run; the exit code."""
    import atexit
    import io
    import runpy
    import signal

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])

    def stream(fd, mode, errors):
        raw = io.open(fd, mode + "b", buffering=-1, closefd=False)
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, line_buffering=raw.isatty(),
                                write_through=False)

    sys.stdin = sys.__stdin__ = stream(0, "r", "strict")
    sys.stdout = sys.__stdout__ = stream(1, "w", "strict")
    sys.stderr = sys.__stderr__ = stream(2, "w", "backslashreplace")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))

    # sys.path as the interpreter would set it for this call: the caller's PYTHONPATH entries
    # (the server's were read at its start), behind the script's folder ("" for -c, the working
    # folder for -m).
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[0:0] = extra
    args = request["argv"]
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c"] + args[2:]
            sys.path.insert(0, "")
            main = {"__name__": "__main__", "__builtins__": __builtins__}
            exec(compile(args[1], "<string>", "exec"), main)
        elif args[0] == "-m":
            sys.argv = [args[1]] + args[2:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[0])
            sys.argv = [args[0]] + args[1:]
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        kind, value, tb = sys.exc_info()
        # The traceback as the interpreter prints it: from the script's first frame, without
        # this file's and runpy's.
        while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                                  or "runpy" in tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        sys.excepthook(kind, value.with_traceback(tb), tb)
        code = 1
    # What the interpreter's shutdown does before it exits: wait for the script's non-daemon
    # threads, then run the atexit functions.
    try:
        import threading
        threading._shutdown()
    except BaseException:
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            code = code or 120
    return code


def _exit_code(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write(f"{value}\n")
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--warm-python-server":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if p != here]  # each run puts its script's folder first
        sys.exit(server(sys.argv[2]))
    sys.exit("usage: warm_python.py --warm-python-server KEY (the client is build/tests/warm_python)")
