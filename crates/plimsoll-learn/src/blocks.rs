//! Generated blocks in a Markdown page: `<!-- generated: NAME -->`, the block, then
//! `<!-- end generated -->`, each marker on a line of its own. Everything between the two
//! markers belongs to the generator; everything else is written by hand.

use crate::LearnError;

const END: &str = "<!-- end generated -->";

fn open(name: &str) -> String {
    format!("<!-- generated: {name} -->")
}

/// Where block `name`'s body starts and ends in `page` (byte offsets).
fn span(page: &str, name: &str) -> Result<(usize, usize), LearnError> {
    let marker = open(name);
    let start = page
        .find(&format!("{marker}\n"))
        .ok_or_else(|| LearnError::Block(format!("the page has no block {marker}")))?
        + marker.len()
        + 1;
    let rest = &page[start..];
    let len = if rest.starts_with(END) {
        Some(0)
    } else {
        rest.find(&format!("\n{END}")).map(|i| i + 1)
    }
    .ok_or_else(|| LearnError::Block(format!("block {name} is not closed by {END}")))?;
    Ok((start, start + len))
}

/// The body of block `name`.
pub fn extract<'a>(page: &'a str, name: &str) -> Result<&'a str, LearnError> {
    let (a, b) = span(page, name)?;
    Ok(&page[a..b])
}

/// `page` with the body of block `name` replaced by `body` (a newline is added if missing).
pub fn replace(page: &str, name: &str, body: &str) -> Result<String, LearnError> {
    let (a, b) = span(page, name)?;
    let mut out = String::with_capacity(page.len() + body.len());
    out.push_str(&page[..a]);
    out.push_str(body);
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&page[b..]);
    Ok(out)
}

/// The names of every block in `page`, in order.
pub fn names(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| {
            l.strip_prefix("<!-- generated: ")
                .and_then(|r| r.strip_suffix(" -->"))
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_replaced_and_listed() {
        let page = "intro\n<!-- generated: e -->\n<!-- end generated -->\n<!-- generated: a -->\nold\n<!-- end generated -->\nmiddle\n<!-- generated: b -->\n<!-- end generated -->\n";
        assert_eq!(extract(page, "a").unwrap(), "old\n");
        assert_eq!(extract(page, "b").unwrap(), "");
        let new = replace(page, "a", "new\nlines").unwrap();
        assert_eq!(extract(&new, "a").unwrap(), "new\nlines\n");
        assert!(
            new.starts_with("intro\n<!-- generated: e -->\n<!-- end")
                && new.ends_with("middle\n<!-- generated: b -->\n<!-- end generated -->\n")
        );
        let new = replace(&new, "b", "x\n").unwrap();
        assert_eq!(extract(&new, "b").unwrap(), "x\n");
        assert_eq!(names(&new), ["e", "a", "b"]);
        let new = replace(&new, "e", "first").unwrap();
        assert_eq!(extract(&new, "e").unwrap(), "first\n");
        assert_eq!(extract(&new, "a").unwrap(), "new\nlines\n");
        assert!(extract(page, "c")
            .unwrap_err()
            .to_string()
            .contains("no block"));
        assert!(extract("<!-- generated: a -->\nopen", "a").is_err());
    }
}
