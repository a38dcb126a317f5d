// `ft-train tokenize`: the tokenizer as a line-oriented filter, for checking
// ids against another implementation and for scripts.
//
//   encode (default): each stdin line is a JSON string; prints one JSON array
//                     of ids per line.
//   decode:           each stdin line is a JSON array of ids; prints one JSON
//                     string per line (skip_special_tokens = false).
#pragma once

#include <string>
#include <vector>

namespace ft {

// `model_or_file`: a tokenizer.json or a model directory. Returns the process
// exit code: 0, or 2 (kExitBadInput) when the tokenizer does not load or a
// line is not the expected JSON (the message names the line number).
int RunTokenizeCommand(const std::string& model_or_file, bool add_special_tokens, bool decode);

// `ft-train tokenize --job JOB.yaml`: indexes (tokenizes) every source of the
// job's data.train and data.eval the way a run would, leaving each source's
// index (<file>.ftidx) for the run, and prints per source its rows, examples,
// tokens and targets, its share and the share it realises over the job's
// rows (max_steps x global_batch_size, or its epochs). Returns 0, or 2
// (kExitBadInput) with the error naming the file, line and key.
int RunDataReport(const std::string& job_file, const std::vector<std::string>& overrides);

}  // namespace ft
