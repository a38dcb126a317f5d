// The job's identity for resumption: the job.yaml keys that define the
// training math, with their values, and their SHA-256 (a checkpoint's and
// COMPLETE.json's job_hash). A resume refuses a checkpoint whose values
// differ, naming the key; ftd compares hashes to reconcile what it finds on
// disk with the job it holds.
//
// Thread safety: thread-safe (DataFileSha256's cache has its own lock).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/job/job_spec.h"

namespace ft {

// The job keys that define the training math, with their values; a resume
// refuses a checkpoint whose values differ (naming the key). The data is
// identified by its content: `data_sha256` is SourcesSha256 of data.train's
// sources (Mixture::sha256()); when empty, the file is read and hashed here (about
// 1 GB/s; the result is kept per file version, DataFileSha256).
std::map<std::string, std::string> JobMathKeys(const JobSpec& spec, const std::string& data_sha256 = "");
// The data's identity over its sources' SHA-256s, in data.train's order: the file's own for one
// source, else the SHA-256 of the list (one per line). engine/data/mixture.h's sha256().
std::string SourcesSha256(const std::vector<std::string>& source_sha256s);
// SHA-256 of JobMathKeys (a checkpoint's and COMPLETE.json's job_hash).
std::string JobHash(const JobSpec& spec, const std::string& data_sha256 = "");

// SHA-256 of a data file's contents ("?" when unreadable), for a caller that
// has no Dataset (ftd). A result is kept per file version (device, inode,
// size, mtime, ctime) once the version is 2 s old, so each version is hashed
// once; a younger one is hashed every time (a rewrite within the clock's
// granularity can leave all five the same).
std::string DataFileSha256(const std::string& path);

}  // namespace ft
