//! plimsoll-quickjs-worker: the QuickJS worker as a binary of its own (plimsolld and
//! `plimsoll` re-execute themselves instead; `SANDBOX_QUICKJS_WORKER` may name this one).
//! Reads one JSON request on stdin, writes one JSON answer on stdout.

fn main() -> std::process::ExitCode {
    plimsoll_log::fds::at_start("plimsoll-quickjs-worker");
    std::process::ExitCode::from(plimsoll_quickjs::worker::main())
}
