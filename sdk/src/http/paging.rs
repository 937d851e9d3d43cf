//! Pages of a listing in key order, for the API and the UI alike: a page ends with the bare id
//! of its last row, which the next page is asked to start after.

use crate::namespace;

/// The first `limit` rows of `rows` (already past the page before), and the bare id of the
/// last of them when more rows follow: the `after` of the next page.
pub(crate) fn take_page<T>(
    rows: impl IntoIterator<Item = (String, T)>,
    limit: usize,
) -> (Vec<(String, T)>, Option<String>) {
    let mut rows = rows.into_iter();
    let page: Vec<_> = rows.by_ref().take(limit).collect();
    let next = match rows.next() {
        Some(_) => page.last().map(|(id, _)| namespace::split(id).1.to_owned()),
        None => None,
    };
    (page, next)
}

/// The rows of a listing of stored keys (in the store's key order) that come after `after`,
/// also a stored key: the operations of a namespace sort as their bare keys do.
pub(crate) fn keyed_after<T>(
    rows: Vec<(String, T)>,
    after: Option<String>,
) -> impl Iterator<Item = (String, T)> {
    rows.into_iter()
        .filter(move |(key, _)| after.as_ref().is_none_or(|after| key > after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_names_its_last_row_only_when_more_follow() {
        let stored = |k: &str| namespace::qualify("billing", "key", k).unwrap();
        let rows = || ["a", "b", "c"].map(|k| (stored(k), ()));
        let (page, next) = take_page(rows(), 2);
        assert_eq!(page.len(), 2);
        assert_eq!(next.as_deref(), Some("b"), "bare");
        let (page, next) = take_page(rows(), 3);
        assert_eq!((page.len(), next), (3, None), "the last page");
        let after = Some(stored("b"));
        let rest: Vec<_> = keyed_after(rows().to_vec(), after).collect();
        assert_eq!(rest, [(stored("c"), ())]);
    }
}
