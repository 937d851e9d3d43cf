//! Error accumulation: every phase reports into one `Diagnostics` so the user sees all of
//! their mistakes in one build rather than one per build.

use proc_macro2::TokenStream;
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Diagnostics {
    errors: Vec<syn::Error>,
}

impl Diagnostics {
    pub(crate) fn push(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// Reports `message` on the span of `tokens` (first to last token, so a whole type or
    /// parameter is underlined).
    pub(crate) fn error_at(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// All errors as `compile_error!` invocations, in the order they were found.
    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.errors
            .into_iter()
            .map(|error| error.to_compile_error())
            .collect()
    }
}
