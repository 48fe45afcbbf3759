package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/internal/admin"
)

func newPauseCmd(s streams) *cobra.Command { return pauseCmd(s, true) }

func newResumeCmd(s streams) *cobra.Command { return pauseCmd(s, false) }

// pauseCmd is `pause` or `resume`.
func pauseCmd(s streams, pause bool) *cobra.Command {
	var queue string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "resume --queue Q",
		Short: "let a paused queue's tasks be claimed again",
		Long: `Resumes queue Q: every instance claims its tasks again.

Exit status: 0 done, 1 Redis failed, 2 bad arguments or settings.`,
	}
	if pause {
		cmd.Use, cmd.Short = "pause --queue Q", "stop every instance claiming a queue's tasks"
		cmd.Long = `Pauses queue Q: every instance claims nothing from it until
dispatcher resume --queue Q. Tasks keep being scheduled meanwhile.

Exit status: 0 done, 1 Redis failed, 2 bad arguments or settings.`
	}
	cmd.Args = noArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, 10*time.Second)
		if err != nil {
			return err
		}
		defer done()
		if pause {
			err = admin.Pause(ctx, se.rdb, se.adminQueue(q), time.Now().UnixMilli())
		} else {
			err = admin.Resume(ctx, se.rdb, se.adminQueue(q))
		}
		if err != nil {
			return se.redisFailure(err)
		}
		se.print(map[string]any{"queue": q.Name, "paused": pause}, func(w io.Writer) {
			if pause {
				fmt.Fprintf(w, "queue %s paused: every instance claims nothing from it until `dispatcher resume --queue %s`\n", q.Name, q.Name)
			} else {
				fmt.Fprintf(w, "queue %s resumed\n", q.Name)
			}
		})
		return nil
	}
	queueFlag(cmd.Flags(), &queue)
	jsonFlag(cmd.Flags(), &asJSON)
	return cmd
}
