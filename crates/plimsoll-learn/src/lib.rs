//! The pages for people new to sandboxes, `docs/learn/`, and what keeps them honest.
//!
//! - [`programs`]: the five programs of `what-a-sandbox-is.md`, run for real through
//!   `plimsoll run` on the `process` tier, and the page blocks made from what they printed.
//! - [`records`]: the signed records `check.html` loads (`check/bundle.js`, made from the
//!   bundle `records/runs.jsonl` and the key `records/harness.pub`), and the blocks of
//!   `proof-of-what-ran.md` made from them.
//! - [`blocks`]: the generated blocks of a Markdown page, between `<!-- generated: NAME -->`
//!   and `<!-- end generated -->`, so a test can regenerate them and compare.
//! - [`browser`]: headless Chromium (Debian's `chromium-headless-shell`) opening a page from
//!   disk: its DOM after the scripts ran, a screenshot, and the URLs it asked for.
//!
//! `cargo xtask pages` writes the blocks and the records; the tests in `bins/plimsoll`,
//! `bins/plimsoll-attest` and this crate fail when a page and what produced it drift apart.

pub mod blocks;
pub mod browser;
pub mod programs;
pub mod records;

use std::path::PathBuf;

/// What can go wrong making or checking a page.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// A page lacks a block, or a block is not closed.
    #[error("{0}")]
    Block(String),
    /// A program could not be run, or its answer could not be read.
    #[error("{0}")]
    Run(String),
    /// The shipped bundle could not be read.
    #[error("{0}")]
    Bundle(String),
    /// The browser could not be started or did not finish.
    #[error("{0}")]
    Browser(String),
    /// A file could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LearnError {
    let context = context.into();
    move |source| LearnError::Io { context, source }
}

/// `docs/learn/` of this checkout.
pub fn learn_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/learn")
}

/// The page "what a sandbox is".
pub const SANDBOX_PAGE: &str = "what-a-sandbox-is.md";
/// The page "proof of what ran".
pub const PROOF_PAGE: &str = "proof-of-what-ran.md";
