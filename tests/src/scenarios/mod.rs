//! Every scenario that does not care how the agent is reached, written once against
//! a [`Target`] and collected in [`all`]; `crate::suite` runs the list over every
//! transport.
//!
//! Scenarios share their transport's agent with one another, so each keeps to its own
//! paths ([`Target::scratch`]) and processes, and asserts on nothing global (such as
//! the full `ps` list). What needs agent flags, `sandboxctl`, its own agent process,
//! or facts only a microVM has (power-off, two VMs, templates) lives in its own test
//! target, using the same helpers.
//!
//! # Layout
//! One module per area: [`exec`], [`spawn_logs`], [`kill_ps`], [`pty`], [`files`],
//! [`put_get`], [`protocol`] (raw frames), [`machine`] (what is safe on a shared
//! agent), [`concurrency`], [`wait`] (`wait_for_text`), [`eval`] (interpreter sessions).

// Scenarios are tests: a failed unwrap is a failed test, with the value in the message.
#![allow(clippy::unwrap_used)]

use crate::transport::{BoxFuture, Target};

pub mod concurrency;
pub mod eval;
pub mod exec;
pub mod files;
pub mod kill_ps;
pub mod machine;
pub mod protocol;
pub mod pty;
pub mod put_get;
pub mod spawn_logs;
pub mod wait;

/// One scenario: its area and name (the trial is `TRANSPORT::AREA::NAME`) and how to
/// run it.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// The module it lives in.
    pub area: &'static str,
    /// Its function's name.
    pub name: &'static str,
    /// Runs it; a panic is a failure.
    pub run: fn(Target) -> BoxFuture<'static, ()>,
}

/// `area::name, …` → [`Scenario`]s.
macro_rules! scenarios {
    ($($area:ident :: $name:ident),* $(,)?) => {
        vec![$(Scenario {
            area: stringify!($area),
            name: stringify!($name),
            run: |target| Box::pin($area::$name(target)),
        }),*]
    };
}

/// Every transport-independent scenario.
pub fn all() -> Vec<Scenario> {
    scenarios![
        exec::collected_output_keeps_each_streams_order,
        exec::streamed_exec_sends_started_then_output_in_order_then_an_empty_reply,
        exec::a_streamed_exec_delivers_megabytes_of_both_streams_exactly,
        exec::output_past_one_mib_is_truncated_and_the_child_is_not_blocked,
        exec::exactly_one_mib_is_not_truncated,
        exec::timeout_kills_the_whole_process_group_including_grandchildren,
        exec::exit_code_and_signal_are_separate_fields,
        exec::stdin_bytes_reach_the_child_even_past_a_pipe_buffer,
        exec::env_and_cwd_apply_on_a_clean_environment,
        exec::a_missing_cwd_or_program_is_an_error_not_a_hang,
        exec::user_switch_runs_as_that_user_or_is_refused,
        exec::dropping_a_streamed_exec_cancels_it_and_kills_the_group,
        exec::explicit_cancel_gets_a_final_frame,
        spawn_logs::spawn_returns_at_once_and_is_listed,
        spawn_logs::spawn_survives_the_client_disconnecting,
        spawn_logs::logs_keep_the_order_of_chunks_across_streams,
        spawn_logs::follow_from_zero_loses_nothing_and_duplicates_nothing,
        spawn_logs::follow_of_bursts_then_a_replay_from_the_middle,
        spawn_logs::cursors_resume_exactly_where_they_point,
        spawn_logs::ring_wrap_reports_exactly_what_was_dropped,
        spawn_logs::follow_of_a_fast_writer_accounts_for_every_byte,
        spawn_logs::two_followers_of_one_process_see_the_same_bytes,
        spawn_logs::logs_of_an_unknown_pid_is_not_found,
        spawn_logs::exec_output_is_also_kept_in_its_ring,
        kill_ps::sigterm_to_a_running_spawn_ends_it_with_signal_15,
        kill_ps::the_wire_refuses_signal_zero_and_sigkill_ends_a_term_ignorer,
        kill_ps::kill_of_an_exited_process_is_a_no_op_success,
        kill_ps::kill_of_an_unknown_or_untracked_pid_is_not_found,
        kill_ps::kill_signals_the_whole_process_group,
        kill_ps::ps_lists_a_running_exec_while_it_runs,
        kill_ps::ps_lists_running_and_exited_spawns,
        pty::input_reaches_the_shell_and_output_comes_back,
        pty::resize_changes_the_size_and_signals_the_child,
        pty::a_terminal_survives_disconnect_and_replays_on_reattach,
        pty::a_new_connection_takes_over_from_the_end_of_the_replay,
        pty::a_pty_command_with_env_and_cwd_runs_on_a_terminal,
        pty::input_to_an_unknown_terminal_is_not_found,
        pty::pipelined_input_reaches_the_terminal_in_order,
        files::writes_reads_and_stat_agree_with_the_agents_machine,
        files::readers_never_see_a_torn_file,
        files::failed_writes_and_abandoned_puts_leave_nothing_behind,
        files::read_file_refuses_with_a_reason_for_each_case,
        files::names_that_are_not_utf8_survive_the_round_trip,
        put_get::a_big_file_round_trips_with_its_checksum,
        protocol::hello_reply_describes_the_agent,
        protocol::a_garbage_body_gets_an_error_and_the_connection_goes_on,
        protocol::a_frame_with_trailing_bytes_is_rejected_under_its_id,
        protocol::an_oversize_frame_is_refused_under_its_id_and_the_connection_closes,
        protocol::before_the_hello_a_frame_over_a_few_kib_is_refused,
        protocol::requests_past_the_in_flight_cap_are_busy_and_the_rest_are_served,
        protocol::a_huge_length_prefix_then_hang_up_leaves_the_agent_alive,
        protocol::an_unknown_request_variant_is_unsupported,
        protocol::a_wrong_protocol_version_gets_version_mismatch_then_close,
        protocol::a_wrong_magic_is_refused_then_closed,
        protocol::a_request_before_hello_is_refused_then_closed,
        protocol::plain_text_instead_of_a_hello_does_not_hurt_the_agent,
        protocol::a_connection_cut_mid_frame_does_not_hurt_the_agent,
        protocol::errors_about_a_running_requests_id_go_under_id_zero,
        machine::reidentify_refuses_bad_input_and_changes_nothing,
        concurrency::two_hundred_concurrent_requests_on_one_connection_all_answer,
        concurrency::a_long_exec_and_a_follow_do_not_block_other_requests,
        wait::text_already_in_a_file_is_found_at_once,
        wait::text_appended_later_is_found,
        wait::text_split_across_two_writes_is_found,
        wait::a_file_replaced_by_a_rename_is_scanned_anew,
        wait::a_file_created_later_in_a_new_directory_is_found,
        wait::a_spawned_process_output_is_found_in_its_stream,
        wait::output_printed_later_by_a_server_is_waited_for,
        wait::a_process_that_exits_without_the_text_fails_at_once,
        wait::the_deadline_is_a_timed_out_error,
        wait::bad_input_gets_a_typed_error_each,
        wait::a_cancelled_or_abandoned_wait_leaves_no_descriptor_behind,
        eval::python_state_persists_and_a_trailing_expression_is_its_value,
        eval::python_exceptions_carry_type_message_and_the_cells_traceback,
        eval::output_by_any_route_lands_in_its_own_evaluation,
        eval::driver_like_output_and_stdin_reads_cannot_confuse_the_driver,
        eval::a_timeout_interrupts_the_cell_and_the_session_keeps_its_state,
        eval::an_interpreter_that_ignores_the_interrupt_is_killed_and_reported_dead,
        eval::exit_ends_the_session_and_only_restart_starts_a_fresh_one,
        eval::sessions_are_listed_as_sessions_and_killed_like_any_process,
        eval::close_session_kills_it_and_forgets_the_name,
        eval::shell_sessions_keep_cwd_variables_and_functions_and_report_status,
        eval::bad_requests_get_typed_errors,
        eval::output_and_values_are_capped,
        eval::evaluations_of_one_session_run_in_turn,
        eval::a_dropped_evaluation_is_interrupted_and_the_session_lives_on,
        eval::resumed_reseeds_the_sessions_generators,
        eval::a_death_is_reported_even_while_a_leftover_job_keeps_writing,
    ]
}

/// The bytes of a batch's chunks, in order.
pub(crate) fn chunk_bytes(chunks: &[sandbox_protocol::OutputChunk]) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.data.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_are_unique() {
        let mut names: Vec<_> = all().iter().map(|s| (s.area, s.name)).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "two scenarios share a name");
    }
}
