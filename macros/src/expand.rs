//! Code generation: the unit struct, the body kept as an associated function, and the
//! `Activity`/`Workflow` and `Register` impls.
//!
//! Generated code names everything by absolute path (`::waymark::__private`, `::core`, `::std`)
//! so it works whatever the user has imported or shadowed.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, LitStr, Type};

use crate::args::{self, Args};
use crate::diagnostics::Diagnostics;
use crate::kind::MacroKind;
use crate::signature::{self, CheckedFn};

/// Entry point of both attributes: parse, validate, then expand, or on any error give back the
/// user's item untouched next to every error found.
pub(crate) fn expand(kind: MacroKind, args: TokenStream, item: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::default();
    let args = args::parse(kind, args, &mut diagnostics);
    let checked = signature::parse(kind, item.clone(), &mut diagnostics)
        .and_then(|function| signature::check(kind, function, &mut diagnostics));
    match checked {
        Some(checked) if !diagnostics.has_errors() => generate(kind, &args, &checked),
        _ => {
            let errors = diagnostics.into_compile_errors();
            quote! { #item #errors }
        }
    }
}

/// Name of the associated function holding the user's body.
const BODY_FN: &str = "__waymark_body";

fn generate(kind: MacroKind, args: &Args, checked: &CheckedFn) -> TokenStream {
    let attributes = SplitAttributes::of(&checked.function.attrs);
    let ident = &checked.function.sig.ident;
    let cfgs = &attributes.cfg;
    let unit_struct = unit_struct(&attributes, checked);
    let body = body_fn(&attributes, checked);
    let trait_impl = trait_impl(kind, args, checked);
    let register = register_impl(kind, ident);
    quote! {
        #unit_struct
        #(#cfgs)* #body
        #(#cfgs)* #trait_impl
        #(#cfgs)* #register
    }
}

/// The function's attributes, sorted by which generated item they belong to.
struct SplitAttributes<'a> {
    /// Documentation describes the activity or workflow: it goes on the struct users see.
    doc: Vec<&'a Attribute>,
    /// Conditional compilation must remove every generated item together.
    cfg: Vec<&'a Attribute>,
    /// Everything else (`#[allow]`, `#[inline]`, ...) was written for the function: it goes on
    /// the body, where it means what it meant (many are errors on a struct).
    function: Vec<&'a Attribute>,
}

impl<'a> SplitAttributes<'a> {
    fn of(attributes: &'a [Attribute]) -> Self {
        let mut split = SplitAttributes {
            doc: Vec::new(),
            cfg: Vec::new(),
            function: Vec::new(),
        };
        for attribute in attributes {
            let path = attribute.path();
            if path.is_ident("doc") {
                split.doc.push(attribute);
            } else if path.is_ident("cfg") {
                split.cfg.push(attribute);
            } else {
                split.function.push(attribute);
            }
        }
        split
    }
}

/// The unit struct that replaces the function's name, so `load_order` is a value that can
/// be registered and scheduled.
fn unit_struct(attributes: &SplitAttributes<'_>, checked: &CheckedFn) -> TokenStream {
    let SplitAttributes { doc, cfg, .. } = attributes;
    let vis = &checked.function.vis;
    let ident = &checked.function.sig.ident;
    quote! {
        #(#doc)*
        #(#cfg)*
        #[allow(non_camel_case_types)]
        #[derive(
            ::core::clone::Clone,
            ::core::marker::Copy,
            ::core::fmt::Debug,
            ::core::default::Default,
        )]
        #vis struct #ident;
    }
}

/// The user's function, renamed and moved into an inherent impl. Its signature and body keep
/// their original spans, so type errors point at the user's code.
fn body_fn(attributes: &SplitAttributes<'_>, checked: &CheckedFn) -> TokenStream {
    let function_attributes = &attributes.function;
    let ident = &checked.function.sig.ident;
    let mut sig = checked.function.sig.clone();
    sig.ident = Ident::new(BODY_FN, ident.span());
    let block = &checked.function.block;
    quote! {
        impl #ident {
            #(#function_attributes)*
            // Activities may take many inputs; that is the user's API, not a smell here.
            #[allow(clippy::too_many_arguments)]
            #sig #block
        }
    }
}

/// `impl Activity` or `impl Workflow`.
fn trait_impl(kind: MacroKind, args: &Args, checked: &CheckedFn) -> TokenStream {
    let ident = &checked.function.sig.ident;
    let KindPaths {
        trait_path,
        context_type,
        error_type,
    } = KindPaths::of(kind);
    let input_type = input_type(&checked.inputs);
    let ok_type = &checked.ok_type;
    let name = journal_name(args, ident);
    let options = options_fn(args);
    let run = run_fn(&context_type, &error_type, checked);
    quote! {
        impl #trait_path for #ident {
            type Input = #input_type;
            type Output = #ok_type;
            const NAME: &'static str = #name;
            #options
            #run
        }
    }
}

/// The absolute paths that differ between activities and workflows.
struct KindPaths {
    trait_path: TokenStream,
    context_type: TokenStream,
    error_type: TokenStream,
}

impl KindPaths {
    fn of(kind: MacroKind) -> Self {
        match kind {
            MacroKind::Activity => KindPaths {
                trait_path: quote!(::waymark::__private::Activity),
                context_type: quote!(::waymark::__private::ActivityContext),
                error_type: quote!(::waymark::__private::ActivityError),
            },
            MacroKind::Workflow => KindPaths {
                trait_path: quote!(::waymark::__private::Workflow),
                context_type: quote!(::waymark::__private::WorkflowContext),
                error_type: quote!(::waymark::__private::WorkflowError),
            },
        }
    }
}

/// `()` for no input, the type itself for one, a tuple for several.
fn input_type(inputs: &[Type]) -> TokenStream {
    match inputs {
        [single] => quote!(#single),
        _ => quote!((#(#inputs),*)),
    }
}

/// The pattern `run` binds its input with, mirroring `input_type`, and the names it binds.
fn input_pattern(count: usize) -> (TokenStream, Vec<Ident>) {
    let names: Vec<Ident> = (0..count)
        .map(|index| format_ident!("input_{index}"))
        .collect();
    let pattern = match names.as_slice() {
        [single] => quote!(#single),
        _ => quote!((#(#names),*)),
    };
    (pattern, names)
}

/// The `name = "..."` argument, or the function's name (without `r#`).
fn journal_name(args: &Args, ident: &Ident) -> LitStr {
    match args.string("name") {
        Some(name) => name.clone(),
        None => LitStr::new(&ident.unraw().to_string(), ident.span()),
    }
}

/// Overrides `Activity::options` only when the attribute sets something, so the SDK's
/// defaults stay in one place.
fn options_fn(args: &Args) -> TokenStream {
    let max_attempts = args.int("max_attempts").map(|n| quote!(.max_attempts(#n)));
    let timeout = args
        .int("timeout_ms")
        .map(|ms| quote!(.start_to_close_timeout(::core::time::Duration::from_millis(#ms))));
    let backoff = args
        .int("initial_backoff_ms")
        .map(|ms| quote!(.initial_backoff(::core::time::Duration::from_millis(#ms))));
    if max_attempts.is_none() && timeout.is_none() && backoff.is_none() {
        return TokenStream::new();
    }
    quote! {
        fn options(&self) -> ::waymark::__private::ActivityOptions {
            ::waymark::__private::ActivityOptions::default() #max_attempts #timeout #backoff
        }
    }
}

/// `run`: unpacks the input, calls the body and converts its error type.
fn run_fn(
    context_type: &TokenStream,
    error_type: &TokenStream,
    checked: &CheckedFn,
) -> TokenStream {
    let (pattern, names) = input_pattern(checked.inputs.len());
    // An activity without a context parameter ignores it; the `_` keeps that warning-free.
    let context = if checked.takes_context {
        quote!(context)
    } else {
        quote!(_context)
    };
    let passed_context = checked.takes_context.then(|| quote!(context,));
    let body_fn = Ident::new(BODY_FN, Span::call_site());
    // Located at the user's error type so a missing `Into` impl is reported there, but
    // resolved at the call site so lints still treat the conversion as macro-generated.
    let error_span = Span::call_site().located_at(checked.err_type.span());
    let convert = quote_spanned! {error_span=>
        ::core::result::Result::map_err(result, ::core::convert::Into::into)
    };
    quote! {
        fn run(
            &self,
            #context: #context_type,
            #pattern: Self::Input,
        ) -> ::waymark::__private::BoxFuture<
            'static,
            ::core::result::Result<Self::Output, #error_type>,
        > {
            ::std::boxed::Box::pin(async move {
                let result = Self::#body_fn(#passed_context #(#names),*).await;
                #convert
            })
        }
    }
}

/// `impl Register`, so a worker can host the struct without naming its kind.
fn register_impl(kind: MacroKind, ident: &Ident) -> TokenStream {
    let add = match kind {
        MacroKind::Activity => quote!(add_activity),
        MacroKind::Workflow => quote!(add_workflow),
    };
    quote! {
        impl ::waymark::__private::Register for #ident {
            fn register_into(self, registry: &mut ::waymark::__private::Registry) {
                registry.#add(self);
            }
        }
    }
}
