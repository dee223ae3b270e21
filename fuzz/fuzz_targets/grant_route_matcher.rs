//! Fuzzes the broker's route matcher: route templates, then a blank line, then
//! `METHOD target`; checks that nothing it allows holds traversal or encoded separators.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    plimsoll_grants::route::fuzz_judge(data);
    plimsoll_grants::profile::fuzz_parse(data);
});
