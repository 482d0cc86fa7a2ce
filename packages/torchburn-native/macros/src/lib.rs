//! `#[isa_versions]`: compiles a function once per instruction-set level and picks the version on
//! every call from `crate::isa::level()`.
//!
//! A dispatch crate that picks by CPU detection alone cannot be told to use a lower level, and then an
//! AVX-512 machine never runs the AVX2 or baseline code its users' machines run. This attribute asks
//! the engine's own `isa::level()` (the CPU's best level, capped by `TORCHBURN_ISA`) instead, so every
//! path can be forced and tested anywhere.
//!
//! ```ignore
//! #[isa_versions]
//! fn dot(a: &[f32], b: &[f32]) -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() }
//! ```
//! expands to `dot` holding three copies of the body: one with AVX-512 enabled, one with AVX2+FMA,
//! and the portable one; on aarch64, NEON is part of the target's baseline, so the portable copy is
//! already the NEON one. The body is compiled under `#[target_feature]`, so LLVM vectorises it for that
//! level and inlines `#[inline(always)]` helpers into it.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote;
use syn::{parse_macro_input, FnArg, GenericParam, Ident, ItemFn, Pat, PatIdent, PatType};

/// Features each x86-64 level compiles with; `isa::level()` reports a level only when the CPU has
/// every one of them.
const AVX512: &str = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c";
const AVX2: &str = "avx2,fma,f16c";

#[proc_macro_attribute]
pub fn isa_versions(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[isa_versions] takes no arguments")
            .to_compile_error()
            .into();
    }
    let function = parse_macro_input!(item as ItemFn);
    match expand(function) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

fn expand(function: ItemFn) -> syn::Result<TokenStream2> {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    if let Some(receiver) = sig.receiver() {
        return Err(syn::Error::new_spanned(
            receiver,
            "#[isa_versions] needs a free function",
        ));
    }
    if sig.asyncness.is_some() || sig.constness.is_some() {
        return Err(syn::Error::new_spanned(
            &sig,
            "#[isa_versions] needs a plain (non-async, non-const) fn",
        ));
    }

    // The outer function names every argument `__isa_argN`, so any pattern the inner copies
    // destructure (`mut x`, tuples) is passed through unchanged.
    let mut outer = sig.clone();
    let mut forwarded = Vec::new();
    for (i, input) in outer.inputs.iter_mut().enumerate() {
        let FnArg::Typed(PatType { pat, .. }) = input else {
            unreachable!("receiver rejected above")
        };
        let name = Ident::new(&format!("__isa_arg{i}"), Span::call_site());
        **pat = Pat::Ident(PatIdent {
            attrs: Vec::new(),
            by_ref: None,
            mutability: None,
            ident: name.clone(),
            subpat: None,
        });
        forwarded.push(name);
    }

    // Explicit type and const parameters go through a turbofish; lifetimes are inferred.
    let turbofish_args: Vec<TokenStream2> = sig
        .generics
        .params
        .iter()
        .filter_map(|param| match param {
            GenericParam::Type(t) => {
                let ident = &t.ident;
                Some(quote!(#ident))
            }
            GenericParam::Const(c) => {
                let ident = &c.ident;
                Some(quote!(#ident))
            }
            GenericParam::Lifetime(_) => None,
        })
        .collect();
    let turbofish = if turbofish_args.is_empty() {
        quote!()
    } else {
        quote!(::<#(#turbofish_args),*>)
    };

    // Lint settings apply to every copy; docs and other attributes stay on the outer function.
    let lints: Vec<_> = attrs
        .iter()
        .filter(|a| {
            ["allow", "expect", "warn", "deny"]
                .iter()
                .any(|name| a.path().is_ident(name))
        })
        .collect();

    let copy = |name: &str| {
        let mut inner = sig.clone();
        inner.ident = Ident::new(name, Span::call_site());
        inner.unsafety = Some(Default::default());
        inner
    };
    let (avx512, avx2, portable) = (
        copy("__isa_avx512"),
        copy("__isa_avx2"),
        copy("__isa_portable"),
    );
    let (avx512_name, avx2_name, portable_name) = (&avx512.ident, &avx2.ident, &portable.ident);

    Ok(quote! {
        #(#attrs)*
        #vis #outer {
            #[cfg(target_arch = "x86_64")]
            {
                #(#lints)*
                #[target_feature(enable = #AVX512)]
                #avx512 #block

                #(#lints)*
                #[target_feature(enable = #AVX2)]
                #avx2 #block

                match crate::isa::level() {
                    // SAFETY: `level()` reports a level only when the CPU has all of its features.
                    crate::isa::Level::Avx512 => return unsafe { #avx512_name #turbofish (#(#forwarded),*) },
                    crate::isa::Level::Avx2 => return unsafe { #avx2_name #turbofish (#(#forwarded),*) },
                    _ => {}
                }
            }

            #(#lints)*
            #[inline(always)]
            #portable #block

            // SAFETY: the portable copy enables no feature; the outer function's own contract holds.
            unsafe { #portable_name #turbofish (#(#forwarded),*) }
        }
    })
}
