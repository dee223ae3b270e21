//! Fuzzes the broker's route matcher: route templates, then a blank line, then
//! `METHOD target`; checks that nothing it allows holds traversal or encoded separators.
//! The same bytes go to the grants-file parser and to the method-override scan (first
//! line a query, the rest a body).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    plimsoll_grants::route::fuzz_judge(data);
    plimsoll_grants::profile::fuzz_parse(data);
    plimsoll_grants::method_override::fuzz_check(data);
});
