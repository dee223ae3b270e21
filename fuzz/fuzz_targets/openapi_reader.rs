//! Fuzzes the OpenAPI reader (JSON and YAML, with its alias and depth limits) and checks
//! every route it extracts passes the grant's own route check.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    plimsoll_openapi::fuzz_read(data);
});
