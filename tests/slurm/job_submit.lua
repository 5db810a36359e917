-- The suite's cluster's job_submit plugin (SLURM's JobSubmitPlugins=lua): a centre's
-- submission rules, enforced where centres enforce theirs, on every job allocation
-- (sbatch, and srun or salloc outside a job). tests/slurm/cluster.py writes this file
-- beside slurm.conf with RULES, the path of the rules of the twin under test, set first;
-- with no rules file every job is taken.
--
-- Rules (NAME=VALUE lines of RULES):
--   gpu_model=MODEL  a GPU request must name a GPU model (the Alliance's clusters refuse
--                    an untyped one); MODEL is the one the message suggests.
--   account=required  a job must name its account (-A, or SBATCH_ACCOUNT/SLURM_ACCOUNT):
--                    the centre requires one (Sigma2, JSC), refused as SLURM refuses an
--                    account outside the user's associations.
--   requeue=refused  --requeue is refused: the centre's pages do not say a job may be
--                    requeued (a site twin is strict where its centre is silent).

local function rules()
   local found = {}
   local file = io.open(RULES, "r")
   if not file then
      return found
   end
   for line in file:lines() do
      local name, value = line:match("^([%w_]+)=(.*)$")
      if name then
         found[name] = value
      end
   end
   file:close()
   return found
end

-- The GPU requests of a job without a model, as SLURM hands them to the plugin: each
-- tres_per_* field is a comma-separated list such as "gres:gpu:4" (untyped) or
-- "gres:gpu:h100:4" (typed); "gres/gpu" in later SLURM releases.
local function untyped_gpus(job_desc)
   local untyped = {}
   for _, field in ipairs({"tres_per_job", "tres_per_node", "tres_per_socket",
                           "tres_per_task"}) do
      local request = job_desc[field]
      if request and request ~= slurm.NO_VAL and type(request) == "string" then
         for item in request:gmatch("[^,]+") do
            local gpu = item:match("^gres[:/]gpu:(.*)$") or item:match("^gpu:(.*)$")
            if gpu and gpu:match("^%d+$") then
               table.insert(untyped, field .. "=" .. item)
            end
         end
      end
   end
   return untyped
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local centre = rules()
   if centre.gpu_model then
      local untyped = untyped_gpus(job_desc)
      if #untyped > 0 then
         slurm.log_user("This cluster refuses a GPU request without a GPU model (" ..
                        table.concat(untyped, ", ") .. "): name one, as in " ..
                        "--gpus-per-node=" .. centre.gpu_model .. ":N. [twin: the rule " ..
                        "is the centre's, this wording is the twin's]")
         return slurm.ERROR
      end
   end
   if centre.account == "required" and (job_desc.account == nil or job_desc.account == "") then
      slurm.log_user("This centre requires the project's account of every job (-A, " ..
                     "--account or SBATCH_ACCOUNT)")
      return slurm.ESLURM_INVALID_ACCOUNT
   end
   -- --requeue sets 1 (--no-requeue 0; neither: NO_VAL16).
   if centre.requeue == "refused" and job_desc.requeue == 1 then
      slurm.log_user("--requeue: this centre documents no requeue of a job (the twin is " ..
                     "strict); continue a run by resubmitting it with " ..
                     "TRAIN_RUN_ID=<its first job id>")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
