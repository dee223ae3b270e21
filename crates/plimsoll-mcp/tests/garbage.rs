//! Seeded random tool arguments (the `mcp_tool_args` fuzz target's properties, a few
//! thousand deterministic inputs per `cargo test`): decoding never panics, every refusal
//! names its tool, and every accepted `run_code` builds requests the daemon's own
//! validation accepts, or a clear error.

use plimsoll_core::pb;
use plimsoll_mcp::args::{decode, ArgError, ToolCall, TOOLS};
use plimsoll_mcp::request;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

const KEYS: [&str; 12] = [
    "language",
    "code",
    "files",
    "session",
    "timeout_ms",
    "minimum_isolation",
    "languages",
    "lifetime_ms",
    "idle_timeout_ms",
    "x",
    "",
    "Code",
];

fn value(rng: &mut impl Rng, depth: u32) -> Value {
    match rng.gen_range(0..if depth > 2 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen_range(-5i64..400_000)),
        3 => json!(
            [
                "javascript",
                "python",
                "shell",
                "ruby",
                "vm",
                "process",
                "",
                "s-0"
            ][rng.gen_range(0..8)]
        ),
        4 => json!(format!("s-{}", "ab".repeat(16))),
        5 => {
            let n = rng.gen_range(0..40);
            json!((0..n)
                .map(|_| ['a', '/', '.', '\\', '\0', 'é', ' '][rng.gen_range(0..7)])
                .collect::<String>())
        }
        6 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(object(rng, depth + 1)),
    }
}

fn object(rng: &mut impl Rng, depth: u32) -> Map<String, Value> {
    (0..rng.gen_range(0..6))
        .map(|_| {
            let k = if rng.gen_bool(0.2) {
                [
                    "a.txt",
                    "../up",
                    "config/call.txt",
                    "d/e.py",
                    ".run_code.py",
                ][rng.gen_range(0..5)]
                .to_owned()
            } else {
                KEYS[rng.gen_range(0..KEYS.len())].to_owned()
            };
            (k, value(rng, depth))
        })
        .collect()
}

#[test]
fn random_arguments_never_panic_and_always_say_which_tool() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let call_files = [pb::ProjectFile {
        path: "config/call.txt".into(),
        content: "from the embedder".into(),
    }];
    let mut accepted = 0;
    for i in 0..4000 {
        let tool = TOOLS[i % TOOLS.len()];
        let mut args = object(&mut rng, 0);
        if tool == "run_code" && rng.gen_bool(0.5) {
            args.insert(
                "language".into(),
                json!(["javascript", "python", "shell"][rng.gen_range(0..3)]),
            );
            args.insert("code".into(), json!("print(1)"));
        }
        match decode(tool, Some(&args)) {
            Ok(ToolCall::RunCode(a)) => {
                accepted += 1;
                match request::fresh(&a, &call_files) {
                    Ok(r) => assert!(plimsoll_core::validate::validate_run(&r).is_ok()),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
                if let Ok(r) = request::in_session(&a, &call_files) {
                    assert!(plimsoll_core::validate::validate_session_call(&r).is_ok());
                }
            }
            Ok(_) => {}
            Err(ArgError::Invalid { tool: t, detail }) => {
                assert_eq!(t, tool);
                assert!(
                    !detail.is_empty() && !detail.contains(" at line "),
                    "{detail}"
                );
            }
            Err(e) => panic!("{tool}: {e}"),
        }
    }
    assert!(
        accepted > 100,
        "only {accepted} run_code calls were accepted: the generator is too wild"
    );
}
