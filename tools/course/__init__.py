"""The collection as an nbgrader course: a student release, and autograding into a gradebook.

    python -m tools.course release [--course build/course]
    python -m tools.course grade SUBMISSIONS [--course build/course] [--full] [--timeout 600]

Each lesson notebook is one nbgrader assignment of one notebook (id = its file stem, e.g.
`01_doc2vec_dbpedia`), so a course can release them one at a time and a broken notebook costs
only its own points. The lessons already carry nbgrader's cell metadata and BEGIN/END SOLUTION
and HIDDEN TESTS regions; the points of every test cell are set in lessons.POINTS, and written
into the course's source copies.

The work is nbgrader's: generate_assignment, autograde, generate_feedback, and its SQLite
gradebook, which grades.csv is read back from. Ours (this package) is only what nbgrader lacks
for a class handing in files: finding each student's notebooks in a folder (renamed ones too),
setting aside notebooks that are not valid JSON, putting back test cells a student deleted,
grading each (student, notebook) in a course folder of its own so that several run at once
(nbgrader#174) and merging them into the gradebook, shards graded on several machines and
merged (nbgrader has no gradebook merge), a sandbox around each student's kernel (bubblewrap)
and a memory limit, grading again without a cell that killed the kernel, a progress line with
an ETA, and ending every process a submission started, by PID.

    python -m tools.course grade SUBMISSIONS [--jobs N] [--shard i/m] [--no-sandbox]
    python -m tools.course merge             # after every shard is graded

Modules, each importing only those above it:
- lessons: the course's definition: exercise ids, points, what a lesson reads from another;
- nbgrader_course: the course folder nbgrader works in: its config, the points, the gradebook,
  running nbgrader, ending what a submission started;
- sandbox: the bubblewrap sandbox of a graded kernel, and the memory limit;
- release: the student release;
- submissions: finding and repairing what each student handed in;
- codescan, tamper: the static scan of solution cells for what could make a failing test
  pass (codescan reads one cell; tamper reads the notebook and says what it costs);
- report: which cells failed and why, points from the gradebook, grades.csv and report.txt;
- merge: moving a graded submission from one course folder's gradebook into another's;
- pair: one (student, notebook) graded in a course folder of its own, and merged back;
- progress: the progress line and its ETA;
- grade: autograding a class in stages (plan, sort, grade N pairs at once, merge, feedback,
  report), and what needs no running;
- shards: SHARD=i/m, and merging the shards;
- lms: grades out to an LMS: a roster, Canvas's and Moodle's import files;
- collect: submissions in: an LMS's submission zip into one folder per student;
- export: nbgrader export plugins: grades.csv, and the LMS files (make grade-export);
- __main__: the command line.
"""
