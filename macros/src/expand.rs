//! Code generation: the unit struct, the body kept as an associated function, and the
//! `Activity`/`Workflow` and `Register` impls, plus `Effect` for `#[activity(effect)]`.
//!
//! Generated code names everything by absolute path (`::waymark::__private`, `::core`, `::std`)
//! so it works whatever the user has imported or shadowed.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, ExprPath, Ident, LitInt, LitStr, Type};

use crate::args::{self, Attrs};
use crate::diagnostics::Diagnostics;
use crate::keys;
use crate::kind::MacroKind;
use crate::signature::{self, CheckedFn, Expected};

/// Entry point of both attributes: parse, validate, then expand, or on any error give back the
/// user's item (minus its `#[key]` markers) next to every error found.
pub(crate) fn expand(kind: MacroKind, args: TokenStream, item: TokenStream) -> TokenStream {
    let mut diagnostics = Diagnostics::default();
    let attrs = args::parse(kind, args, &mut diagnostics);
    let Some(mut function) = signature::parse(kind, item.clone(), &mut diagnostics) else {
        return with_errors(item, diagnostics);
    };
    let key_markers = keys::take_markers(&mut function);
    // Left on the item, the markers would add "cannot find attribute `key`" to the real errors.
    let unmarked_item = function.to_token_stream();
    let expected = Expected {
        effect: attrs.effect,
    };
    let checked = signature::check(kind, expected, function, &key_markers, &mut diagnostics);
    match checked {
        Some(checked) if !diagnostics.has_errors() => generate(kind, &attrs, &checked),
        _ => with_errors(unmarked_item, diagnostics),
    }
}

fn with_errors(item: TokenStream, diagnostics: Diagnostics) -> TokenStream {
    let errors = diagnostics.into_compile_errors();
    quote! { #item #errors }
}

/// Name of the associated function holding the user's body.
const BODY_FN: &str = "__waymark_body";

fn generate(kind: MacroKind, attrs: &Attrs, checked: &CheckedFn) -> TokenStream {
    let attributes = SplitAttributes::of(&checked.function.attrs);
    let ident = &checked.function.sig.ident;
    let cfgs = &attributes.cfg;
    let unit_struct = unit_struct(&attributes, checked);
    let body = body_fn(&attributes, checked);
    let trait_impl = trait_impl(kind, attrs, checked, &attributes.doc);
    let effect = attrs.effect;
    let effect_impl = effect.then(|| effect_impl(attrs, checked));
    let register = register_impl(kind, effect, ident);
    quote! {
        #unit_struct
        #(#cfgs)* #body
        #(#cfgs)* #trait_impl
        #(#cfgs)* #effect_impl
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
fn trait_impl(
    kind: MacroKind,
    attrs: &Attrs,
    checked: &CheckedFn,
    doc: &[&Attribute],
) -> TokenStream {
    let ident = &checked.function.sig.ident;
    let KindPaths {
        trait_path,
        context_type,
        error_type,
    } = KindPaths::of(kind);
    let input_type = input_type(&checked.inputs);
    let ok_type = &checked.ok_type;
    let name = journal_name(attrs, ident);
    let options = options_fn(attrs);
    let run = run_fn(&context_type, &error_type, checked);
    let tool = (kind == MacroKind::Activity).then(|| tool_items(attrs, checked, doc));
    let code = (kind == MacroKind::Workflow).then(|| {
        let tokens = tokens_text(&checked.function);
        quote! {
            const CODE_DIGEST: ::core::option::Option<u64> = ::core::option::Option::Some(
                ::waymark::__private::code_digest(#tokens, ::core::env!("CARGO_PKG_VERSION")),
            );
        }
    });
    quote! {
        impl #trait_path for #ident {
            type Input = #input_type;
            type Output = #ok_type;
            const NAME: &'static str = #name;
            #options
            #run
            #tool
            #code
        }
    }
}

/// The function's tokens as written, doc comments included, digested at compile time: the
/// same source gives the same digest in every build, and a change to the function (not to a
/// plain comment) gives another. What it calls is not in it: see `Workflow::CODE_DIGEST`.
fn tokens_text(function: &syn::ItemFn) -> LitStr {
    LitStr::new(&quote!(#function).to_string(), Span::call_site())
}

/// What an activity offers as a tool to a model: its doc comment as the description, its
/// parameter names (the properties of the arguments object) and, for an effect, its key.
fn tool_items(attrs: &Attrs, checked: &CheckedFn, doc: &[&Attribute]) -> TokenStream {
    let description = LitStr::new(&doc_text(doc), Span::call_site());
    let parameters = parameter_names(checked);
    let effect_key = attrs.effect.then(|| {
        quote! {
            fn effect_key(
                input: &Self::Input,
            ) -> ::core::option::Option<::waymark::__private::EffectKey> {
                ::core::option::Option::Some(::waymark::__private::EffectKey {
                    version: <Self as ::waymark::__private::Effect>::VERSION,
                    arguments: <Self as ::waymark::__private::Effect>::key_arguments(input),
                })
            }
        }
    });
    let cached = attrs.cache.then(|| {
        quote!(
            const CACHED: bool = true;
        )
    });
    quote! {
        const DESCRIPTION: &'static str = #description;
        const PARAMETERS: &'static [&'static str] = &[#(#parameters),*];
        #cached
        #effect_key
    }
}

/// The doc comment's text: its lines trimmed, joined by newlines.
fn doc_text(doc: &[&Attribute]) -> String {
    let lines = doc.iter().filter_map(|attribute| match &attribute.meta {
        syn::Meta::NameValue(syn::MetaNameValue {
            value:
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }),
            ..
        }) => Some(text.value().trim().to_owned()),
        _ => None,
    });
    lines.collect::<Vec<_>>().join("\n").trim().to_owned()
}

/// The journaled parameters' names (the context excluded); `arg{i}` for a pattern that is not
/// a plain name.
fn parameter_names(checked: &CheckedFn) -> Vec<LitStr> {
    let skip = usize::from(checked.takes_context);
    let inputs = checked.function.sig.inputs.iter().skip(skip).enumerate();
    let names = inputs.map(|(position, input)| {
        let name = match input {
            syn::FnArg::Typed(typed) => match typed.pat.as_ref() {
                syn::Pat::Ident(pat) => Some(pat.ident.unraw().to_string()),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        };
        let name = name.unwrap_or_else(|| format!("arg{position}"));
        LitStr::new(&name, Span::call_site())
    });
    names.collect()
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
    let names: Vec<Ident> = (0..count).map(input_name).collect();
    let pattern = match names.as_slice() {
        [single] => quote!(#single),
        _ => quote!((#(#names),*)),
    };
    (pattern, names)
}

fn input_name(position: usize) -> Ident {
    format_ident!("input_{position}")
}

/// The `name = "..."` argument, or the function's name (without `r#`).
fn journal_name(attrs: &Attrs, ident: &Ident) -> LitStr {
    match &attrs.name {
        Some(name) => name.clone(),
        None => LitStr::new(&ident.unraw().to_string(), ident.span()),
    }
}

/// Overrides `Activity::options` only when the attribute sets something, so the SDK's
/// defaults stay in one place.
fn options_fn(attrs: &Attrs) -> TokenStream {
    let max_attempts = attrs.max_attempts.as_ref();
    let max_attempts = max_attempts.map(|n| quote!(.max_attempts(#n)));
    let durations = [
        (&attrs.timeout_ms, quote!(start_to_close_timeout)),
        (&attrs.initial_backoff_ms, quote!(initial_backoff)),
        (&attrs.max_backoff_ms, quote!(max_backoff)),
        (&attrs.deadline_ms, quote!(deadline)),
    ];
    let durations = durations.iter().filter_map(|(ms, method)| {
        let ms = ms.as_ref()?;
        Some(quote!(.#method(::core::time::Duration::from_millis(#ms))))
    });
    let setters: Vec<TokenStream> = max_attempts.into_iter().chain(durations).collect();
    if setters.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn options(&self) -> ::waymark::__private::ActivityOptions {
            ::waymark::__private::ActivityOptions::default() #(#setters)*
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
fn register_impl(kind: MacroKind, effect: bool, ident: &Ident) -> TokenStream {
    let add = match kind {
        MacroKind::Activity if effect => quote!(add_effect),
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

/// `impl Effect`: the version, the key arguments and, if given, the reconciler.
fn effect_impl(attrs: &Attrs, checked: &CheckedFn) -> TokenStream {
    let ident = &checked.function.sig.ident;
    // Versions count from 1: an effect that names none is at its first.
    let version = attrs.version.clone();
    let version = version.unwrap_or_else(|| LitInt::new("1", Span::call_site()));
    let key_arguments = key_arguments_fn(checked);
    let reconcile = attrs.reconcile.as_ref();
    let reconcile = reconcile.map(|reconciler| reconcile_fn(reconciler, checked.inputs.len()));
    let at_most_once = attrs.at_most_once.then(|| {
        quote!(
            const AT_MOST_ONCE: bool = true;
        )
    });
    quote! {
        impl ::waymark::__private::Effect for #ident {
            const VERSION: u32 = #version;
            #at_most_once
            #key_arguments
            #reconcile
        }
    }
}

/// `key_arguments`: borrows the `#[key]` inputs out of the input, in declaration order.
fn key_arguments_fn(checked: &CheckedFn) -> TokenStream {
    let is_key = |position: &usize| checked.key_positions.contains(position);
    // Inputs that are not keys are bound to `_`, so the pattern leaves no unused variables.
    let bindings: Vec<TokenStream> = (0..checked.inputs.len())
        .map(|position| {
            if is_key(&position) {
                input_name(position).to_token_stream()
            } else {
                quote!(_)
            }
        })
        .collect();
    let pattern = match bindings.as_slice() {
        [single] => single.clone(),
        _ => quote!((#(#bindings),*)),
    };
    let appends = checked.key_positions.iter().map(|&position| {
        // The argument covers the user's parameter type, so a type that cannot be a key is
        // reported there (with `KeyArgument`'s message) rather than on the attribute.
        let (first, last) = first_and_last_spans(checked.inputs[position].to_token_stream());
        let name = Ident::new(&input_name(position).to_string(), last);
        let argument = spanning(quote!(::core::convert::identity), first, last);
        quote_spanned!(last=> .with(#argument(#name)))
    });
    quote! {
        fn key_arguments(input: &Self::Input) -> ::waymark::__private::KeyArguments {
            let #pattern = input;
            ::waymark::__private::KeyArguments::default() #(#appends)*
        }
    }
}

/// `reconcile`: calls the user's reconciler with the context and the unpacked input.
fn reconcile_fn(reconciler: &ExprPath, input_count: usize) -> TokenStream {
    let (pattern, names) = input_pattern(input_count);
    // Everything about the call sits at the `reconcile = ...` path, so a reconciler with the
    // wrong arguments, return type or error type is reported where it was named.
    let (first, last) = first_and_last_spans(reconciler.to_token_stream());
    let path = at_call_site(reconciler.to_token_stream());
    let map_err = spanning(quote!(::core::result::Result::map_err), first, last);
    let into = spanning(quote!(::core::convert::Into::into), first, last);
    let call = quote_spanned! {last=>
        let result: ::core::result::Result<::waymark::__private::Reconciled<Self::Output>, _> =
            #path(context, #(#names),*).await;
        #map_err(result, #into)
    };
    quote! {
        fn reconcile(
            &self,
            context: ::waymark::__private::ActivityContext,
            #pattern: Self::Input,
        ) -> ::core::option::Option<
            ::waymark::__private::BoxFuture<
                'static,
                ::core::result::Result<
                    ::waymark::__private::Reconciled<Self::Output>,
                    ::waymark::__private::ActivityError,
                >,
            >,
        > {
            ::core::option::Option::Some(::std::boxed::Box::pin(async move { #call }))
        }
    }
}

// rustc spans an expression from its first token to its last, but on stable a proc macro
// cannot join two spans itself. Placing the first and last generated tokens at the ends of
// the user's path makes rustc underline all of it. All spans resolve at the call site, so
// they share one hygiene context and rustc can join them.

/// The locations of the first and last tokens of `tokens`, resolving at the call site.
fn first_and_last_spans(tokens: TokenStream) -> (Span, Span) {
    let mut spans = tokens.into_iter().map(|token| token.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    let last = spans.last().unwrap_or(first);
    let at = |span| Span::call_site().located_at(span);
    (at(first), at(last))
}

/// `tokens`, each kept where it is but resolving at the call site.
fn at_call_site(tokens: TokenStream) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            token.set_span(Span::call_site().located_at(token.span()));
            token
        })
        .collect()
}

/// `tokens` with the first at `first` and the rest at `last`.
fn spanning(tokens: TokenStream, first: Span, last: Span) -> TokenStream {
    tokens
        .into_iter()
        .enumerate()
        .map(|(index, mut token)| {
            token.set_span(if index == 0 { first } else { last });
            token
        })
        .collect()
}
