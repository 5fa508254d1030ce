//! The PostgreSQL frontend/backend protocol (version 3) as sluice needs it:
//! framing for both directions and one module per message kind, with no I/O
//! and no policy. The daemon parses only what policy needs (see DESIGN.md §3)
//! and forwards everything else as the bytes it arrived as, so this crate
//! offers cheap header framing first and full decoding only per message kind.

mod authentication;
mod backend_key_data;
mod builder;
mod cancel_request;
mod command_complete;
mod error;
mod error_response;
mod frame;
mod negotiate_protocol_version;
mod parameter_status;
mod password;
mod query;
mod reader;
mod ready_for_query;
mod row_description;
mod startup;
pub mod tags;

pub use authentication::Authentication;
pub use backend_key_data::BackendKeyData;
pub use builder::MessageBuilder;
pub use cancel_request::CancelRequest;
pub use command_complete::{command_complete, data_row, empty_query_response};
pub use error::WireError;
pub use error_response::{ErrorFields, Severity};
pub use frame::{HEADER_LEN, Header, split_frame, whole_message};
pub use negotiate_protocol_version::negotiate_protocol_version;
pub use parameter_status::ParameterStatus;
pub use password::{PasswordMessage, sasl_initial_response, sasl_response};
pub use query::{encode_query, query_text};
pub use reader::Reader;
pub use ready_for_query::{TransactionStatus, ready_for_query};
pub use row_description::{ColumnType, row_description};
pub use startup::{
    PROTOCOL_V3, StartupPacket, StartupParams, encode_ssl_request, encode_startup, split_startup,
};
