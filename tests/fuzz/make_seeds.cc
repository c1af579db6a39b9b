// Writes the seeds of the fuzz targets whose inputs are binary messages,
// built with the code that sends them for real: ps uploads and pulls as
// PsClient frames them (ps_wire::FrameBuilder), the coordinator's PsWorker
// requests, a rendezvous's coordination requests, ring hellos and acks;
// DISTRAIN_JOB_CONFIG of every examples/*.yaml as JobConfigToJson writes it,
// TF_CONFIG as ClusterSpec::ToJson writes it; and, given a TFRecord shard
// TensorFlow wrote (scripts/mnist_tfrecord.sh's, GZIP), its first records
// as files for the TFRecord targets.
// Usage (from the repository root):
//   fuzz_make_seeds tests/fuzz/corpus [train-00000-of-00004.tfrecord.gz]
// scripts/fuzz.sh --seeds runs it. The files are committed; rerun when a
// message changes.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "common/job_config.h"
#include "distrain/v1/coordination.pb.h"
#include "distrain/v1/parameter_server.pb.h"
#include "distrain/v1/ps_worker.pb.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/ps_messages.h"
#include "tests/fuzz/ring_seed_key.h"
#include "worker/collective/ring.h"
#include "worker/data/tfrecord.h"
#include "zlib.h"

namespace {

using distrain::fuzz::EncodeMessage;

std::filesystem::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::filesystem::path dir = root / target;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string Op(uint8_t op, const std::string& message) {
  return std::string(1, static_cast<char>(op)) + EncodeMessage(message);
}

std::string Stream(uint8_t op, const std::vector<std::string>& messages) {
  std::string out(1, static_cast<char>(op));
  for (const std::string& m : messages) out += EncodeMessage(m);
  return out;
}

void PsSeeds() {
  using distrain::fuzz::UploadStream;
  // ps_wire: a header frame and a chunk frame, whole and cut into slices.
  const std::vector<std::string> upload = UploadStream(false, 3, 4, 1.0f);
  Write("ps_wire", "upload_header", std::string(1, '\0') + upload[0]);
  Write("ps_wire", "upload_chunks", std::string(1, '\0') + upload[1]);
  Write("ps_wire", "upload_chunks_sliced", std::string(1, '\3') + upload[1]);
  // ps_service: CreateVariables, Initialize, Push (whole and as factors of
  // the wrong rank), Pull of a variable and of shards, Save, Restore.
  distrain::v1::CreateVariablesRequest create;
  distrain::v1::ShardSpec* s = create.add_shards();
  s->set_variable("dense/kernel");
  s->set_num_shards(2);
  s->add_full_shape(784);
  s->add_full_shape(128);
  s->set_row_begin(0);
  s->set_row_end(392);
  Write("ps_service", "create_variables", std::string(1, '\0') + create.SerializeAsString());
  Write("ps_service", "initialize", Stream(1, UploadStream(true, -1, 4, 0.25f)));
  Write("ps_service", "push", Stream(2, UploadStream(false, 0, 5, 0.01f)));
  Write("ps_service", "push_one_chunk", Stream(2, UploadStream(false, -1, 64, -0.01f)));
  distrain::v1::PullRequest pull;
  pull.add_variables("dense/kernel");
  pull.add_variables("batch_normalization/moving_mean");
  distrain::v1::ShardRef* ref = pull.add_shards();
  ref->set_variable("dense_1/kernel");
  ref->set_shard(1);
  pull.set_max_chunk_bytes(8);
  Write("ps_service", "pull", Op(3, pull.SerializeAsString()));
  distrain::v1::SaveRequest save;
  save.set_step(10);
  Write("ps_service", "save", Op(4, save.SerializeAsString()));
  distrain::v1::RestoreRequest restore;
  restore.set_step(10);
  Write("ps_service", "restore", Op(5, restore.SerializeAsString()));
}

void PsWorkerSeeds() {
  distrain::v1::PrepareRequest prepare;
  prepare.set_num_features(64);
  prepare.set_num_classes(10);
  prepare.set_plan_fingerprint("0000000000000000");
  prepare.set_worker_index(0);
  prepare.add_example_shape(64);
  distrain::v1::RunStepRequest step;
  step.set_closure_id(3);
  step.set_attempt(1);
  Write("ps_worker", "prepare_run_finish",
        Op(0, prepare.SerializeAsString()) + Op(1, step.SerializeAsString()) + Op(2, ""));
  prepare.set_num_features(784);
  prepare.clear_example_shape();
  for (int d : {28, 28, 1}) prepare.add_example_shape(d);
  Write("ps_worker", "prepare_image", Op(0, prepare.SerializeAsString()));
}

void CoordinationSeeds() {
  namespace v1 = distrain::v1;
  auto task = [](v1::TaskRef* t, const char* type, int index) {
    t->set_type(type);
    t->set_index(index);
  };
  std::string rendezvous;
  for (int i = 0; i < 2; ++i) {
    v1::JoinRequest join;
    task(join.mutable_task(), "worker", i);
    join.set_incarnation("pid-" + std::to_string(100 + i));
    join.set_timeout_ms(1000);
    rendezvous += Op(0, join.SerializeAsString());
  }
  v1::KeyValueSetRequest set;
  set.set_key("mwms/g1/ring/0");
  set.set_value("127.0.0.1:40001");
  rendezvous += Op(2, set.SerializeAsString());
  v1::KeyValueGetRequest get;
  get.set_key("mwms/g1/ring/0");
  get.set_timeout_ms(1000);
  rendezvous += Op(3, get.SerializeAsString());
  for (int i = 0; i < 2; ++i) {
    v1::BarrierRequest barrier;
    barrier.set_name("initial_state");
    task(barrier.mutable_task(), "worker", i);
    barrier.set_timeout_ms(1000);
    rendezvous += Op(4, barrier.SerializeAsString());
  }
  v1::WatchRequest watch;
  task(watch.mutable_task(), "worker", 1);
  watch.set_incarnation("pid-101");
  rendezvous += Op(1, watch.SerializeAsString());
  v1::LeaveRequest leave;
  task(leave.mutable_task(), "worker", 0);
  leave.set_incarnation("pid-100");
  rendezvous += Op(5, leave.SerializeAsString()) + Op(6, "");
  Write("coordination", "rendezvous", rendezvous);
  v1::JoinRequest ps;
  task(ps.mutable_task(), "ps", 0);
  ps.set_incarnation("pid-7");
  Write("coordination", "ps_join_ping", Op(0, ps.SerializeAsString()) + Op(6, ""));
}

void RingSeeds() {
  // Hellos and acks as RingCollective sends them, signed with the fuzz
  // target's key and nonces (tests/fuzz/ring_seed_key.h), and a store value.
  using namespace distrain::fuzz;
  for (int size : {2, 3, 8}) {
    const int selector = size == 2 ? 0 : size == 3 ? 1 : 2;  // data[0] % 3: this rank 0
    const std::string hello =
        distrain::MakeRingHello(kRingSeedGroupId, size - 1, 0, size, kRingSeedKey,
                                kRingSeedDiallerNonce, kRingSeedAcceptorNonce);
    Write("ring_handshake", "hello_" + std::to_string(size),
          std::string(1, static_cast<char>(selector)) + hello);
    const std::string ack = distrain::MakeRingAck(kRingSeedGroupId, 1, kRingSeedKey,
                                                  kRingSeedDiallerNonce, kRingSeedAcceptorNonce);
    Write("ring_handshake", "ack_" + std::to_string(size),
          std::string(1, static_cast<char>(selector)) + ack);
  }
  Write("ring_handshake", "address",
        std::string(1, '\0') + "10.0.0.5:4000 000102030405060708090a0b0c0d0e0f");
}

void JobSeeds() {
  for (const auto& entry : std::filesystem::directory_iterator("examples")) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<distrain::JobConfig> config = distrain::LoadJobYamlFile(entry.path());
    if (!config.ok()) continue;  // not a job (e.g. another kind of document)
    Write("job_json", entry.path().stem().string(), distrain::JobConfigToJson(*config));
  }
}

void TfConfigSeeds() {
  struct Case {
    const char* name;
    std::map<std::string, std::vector<std::string>> jobs;
    distrain::TaskId task;
  };
  const std::vector<Case> cases = {
      {"mwms_worker1", {{"worker", {"job-worker-0.job:2222", "job-worker-1.job:2222"}}},
       {"worker", 1}},
      {"ps_chief",
       {{"chief", {"job-chief-0.job:2222"}},
        {"worker", {"job-worker-0.job:2222", "job-worker-1.job:2222"}},
        {"ps", {"job-ps-0.job:2222", "job-ps-1.job:2222"}}},
       {"chief", 0}},
      {"evaluator_ipv6", {{"worker", {"[::1]:2222", "[::1]:2223"}}, {"evaluator", {"[::1]:2224"}}},
       {"evaluator", 0}},
      {"local", {{"worker", {"127.0.0.1:40001", "127.0.0.2:40002"}}}, {"worker", 0}},
  };
  for (const Case& c : cases) {
    absl::StatusOr<distrain::ClusterSpec> spec = distrain::ClusterSpec::Create(c.jobs, c.task);
    if (!spec.ok()) {
      std::fprintf(stderr, "TF_CONFIG seed %s: %s\n", c.name, spec.status().ToString().c_str());
      std::exit(1);
    }
    Write("tf_config", c.name, spec->ToJson());
  }
}

void TfRecordSeeds(const std::string& shard) {
  absl::StatusOr<distrain::TfRecordReader> reader =
      distrain::TfRecordReader::Open(shard, distrain::TfRecordCompression::kGzip);
  if (!reader.ok()) {
    std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<std::string> records;
  std::string_view record;
  while (records.size() < 3 && *reader->Next(&record)) records.emplace_back(record);
  const std::string file = (root / "mnist_3.tfrecord").string();
  {
    absl::StatusOr<distrain::TfRecordWriter> writer = distrain::TfRecordWriter::Create(file);
    for (const std::string& r : records) (void)writer->Write(r);
  }
  std::ifstream in(file, std::ios::binary);
  const std::string framed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(file);
  Write("tfrecord", "mnist_3_records", framed);
  Write("tfrecord", "mnist_1_record", framed.substr(0, 16 + records[0].size()));
  // tfrecord_dataset: mode 0 with the records as messages (uint8Bytes,
  // [28, 28, 1]); the framed file read plain (mode 1) and gzipped (mode 2).
  std::string messages(1, '\0');
  for (const std::string& r : records) messages += EncodeMessage(r);
  Write("tfrecord_dataset", "mnist_records", messages);
  Write("tfrecord_dataset", "mnist_records_10_classes", std::string(1, '\4') + messages.substr(1));
  Write("tfrecord_dataset", "mnist_file", std::string(1, static_cast<char>(1 << 5)) + framed);
  uLongf bound = compressBound(framed.size()) + 32;
  std::string gz(bound, '\0');
  z_stream z{};
  deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // GZIP
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(framed.data()));
  z.avail_in = framed.size();
  z.next_out = reinterpret_cast<Bytef*>(gz.data());
  z.avail_out = gz.size();
  deflate(&z, Z_FINISH);
  gz.resize(z.total_out);
  deflateEnd(&z);
  Write("tfrecord_dataset", "mnist_file_gzip", std::string(1, static_cast<char>(2 << 5)) + gz);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s <tests/fuzz/corpus> [shard.tfrecord.gz]\n", argv[0]);
    return 2;
  }
  root = argv[1];
  PsSeeds();
  PsWorkerSeeds();
  CoordinationSeeds();
  RingSeeds();
  JobSeeds();
  TfConfigSeeds();
  if (argc == 3) TfRecordSeeds(argv[2]);
  return 0;
}
