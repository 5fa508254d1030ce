//! The macro behind `Settings`: from one table row per key it generates the
//! struct field, its default, the reference entry (`KeyInfo`), and the
//! text conversions used by the file reader, `SET` and SHOW CONFIG. Keeping
//! all of that in one row means a key cannot be known to one of them and
//! missing from another.

/// Rows look like
/// `field: Type = default_expr => "default as shown", Codec, reload|fixed, "doc";`
/// grouped under `pgbouncer { ... }` and `sluice { ... }` for the section the
/// key belongs to. `reload` keys may change while running; `fixed` ones need
/// a restart.
macro_rules! define_settings {
    (
        $(
            $section:ident {
                $(
                    $field:ident : $ty:ty = $default:expr => $shown:expr,
                    $codec:ty, $change:ident, $doc:literal;
                )*
            }
        )*
    ) => {
        /// Every `[pgbouncer]` and `[sluice]` setting, typed. `Default` gives
        /// PgBouncer's documented defaults. Times are `Duration`s; where
        /// PgBouncer says 0 disables a timeout, a zero `Duration` means the
        /// same. See `known_keys()` or docs/config.md for each key.
        #[derive(Clone, Debug, PartialEq)]
        pub struct Settings {
            $($(
                #[doc = $doc]
                pub $field: $ty,
            )*)*
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings {
                    $($( $field: $default, )*)*
                }
            }
        }

        impl Settings {
            /// One reference entry per field, in table order.
            pub(crate) const FIELD_INFO: &'static [$crate::key_info::KeyInfo] = &[
                $($(
                    $crate::key_info::KeyInfo {
                        key: stringify!($field),
                        default: $shown,
                        changeable: $crate::settings_macro::changeable!($change),
                        section: stringify!($section),
                        doc: $doc,
                    },
                )*)*
            ];

            /// Parses `text` into the field named `key` (canonical lower-case
            /// name, no aliases). `None` if no field has that name; `Some(Err)`
            /// carries the reason the text is not a valid value.
            pub(crate) fn apply_field(
                &mut self,
                key: &str,
                text: &str,
            ) -> Option<Result<(), String>> {
                use $crate::codecs::Codec as _;
                match key {
                    $($(
                        stringify!($field) => Some(
                            <$codec>::parse(text).map(|value| self.$field = value),
                        ),
                    )*)*
                    _ => None,
                }
            }

            /// Sets the field named `key` (canonical lower-case name) to
            /// `from`'s; false if no field has that name.
            pub(crate) fn copy_field(&mut self, key: &str, from: &Self) -> bool {
                match key {
                    $($(
                        stringify!($field) => {
                            self.$field = from.$field.clone();
                            true
                        }
                    )*)*
                    _ => false,
                }
            }

            /// The field named `key` shown as SHOW CONFIG would.
            pub(crate) fn show_field(&self, key: &str) -> Option<String> {
                use $crate::codecs::Codec as _;
                match key {
                    $($(
                        stringify!($field) => Some(<$codec>::show(&self.$field)),
                    )*)*
                    _ => None,
                }
            }
        }
    };
}

/// Maps the `reload` / `fixed` marker of a settings row to `changeable`.
macro_rules! changeable {
    (reload) => {
        true
    };
    (fixed) => {
        false
    };
}

pub(crate) use changeable;
pub(crate) use define_settings;
