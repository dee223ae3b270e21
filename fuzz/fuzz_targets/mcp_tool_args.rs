//! Arbitrary bytes as an MCP tool call's arguments: the first byte picks the tool name (or,
//! past the known names, a name taken from the input), the rest is parsed as JSON. The
//! decoder never panics; an accepted `run_code` turns into requests (fresh and in a
//! session) that carry the call files first, pass the daemon's validation and fit its size
//! limit, or into a clear build error.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_core::pb;
use plimsoll_mcp::args::{decode, ToolCall, TOOLS};
use plimsoll_mcp::request;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let name = match TOOLS.get(usize::from(pick) % (TOOLS.len() + 1)) {
        Some(n) => (*n).to_owned(),
        None => String::from_utf8_lossy(&rest[..rest.len().min(16)]).into_owned(),
    };
    let Ok(serde_json::Value::Object(args)) = serde_json::from_slice::<serde_json::Value>(rest) else {
        let _ = decode(&name, None);
        return;
    };
    let Ok(ToolCall::RunCode(a)) = decode(&name, Some(&args)) else {
        return;
    };
    let call_files = [pb::ProjectFile {
        path: "config/call.txt".into(),
        content: "from the embedder".into(),
    }];
    if let Ok(r) = request::fresh(&a, &call_files) {
        assert!(plimsoll_core::validate::validate_run(&r).is_ok());
        if let Some(pb::run_request::Payload::Project(p)) = &r.payload {
            assert_eq!(p.files[0].path, "config/call.txt");
            assert_eq!(p.files.iter().filter(|f| f.path == "config/call.txt").count(), 1);
        }
    }
    if let Ok(r) = request::in_session(&a, &call_files) {
        assert!(plimsoll_core::validate::validate_session_call(&r).is_ok());
    }
});
